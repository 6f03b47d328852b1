package cluster

// ClassifyDBError maps a driver error of dialect d to the package's
// sentinels, as the default provider does, for tests that trip the guard
// triggers with raw SQL.
func ClassifyDBError(d Dialect, err error) error {
	dl, _ := newDialect(d, DefaultTablePrefix)
	return (&DBProvider{d: dl}).wrap("raw SQL", err)
}
