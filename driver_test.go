package cluster_test

import (
	"database/sql/driver"
	"errors"
)

// unknownDriver is a database/sql driver the package cannot identify.
type unknownDriver struct{}

func (unknownDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not a real driver") }
