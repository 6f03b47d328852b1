package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// machine records where and when a result was measured, so that a number
// is never read without its context: other engineers share this machine,
// and the load average says how busy it was.
type machine struct {
	Date      string `json:"date"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpuModel,omitempty"`
	Library   string `json:"library"` // git commit of the library under test
	LoadStart string `json:"loadAvgStart"`
	LoadEnd   string `json:"loadAvgEnd,omitempty"`
	Peers     string `json:"peers"`
	Command   string `json:"command"`
}

func newMachine() machine {
	return machine{
		Date:      time.Now().UTC().Format(time.RFC3339),
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
		CPUs:      runtime.NumCPU(),
		CPUModel:  cpuModel(),
		Library:   libraryCommit(),
		LoadStart: loadAvg(),
		Peers:     peerVersions(),
		Command:   "go run . " + strings.Join(os.Args[1:], " "),
	}
}

// done records the load average at the end of the run.
func (m *machine) done() { m.LoadEnd = loadAvg() }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// libraryCommit is the commit of the library the replace directive points
// at, marked dirty when files outside bench/ have changes.
func libraryCommit() string {
	out, err := exec.Command("git", "-C", "..", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--", ".", ":!bench").Output(); err == nil && len(st) > 0 {
		commit += "-dirty"
	}
	return commit
}

func peerVersions() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var vs []string
	for _, d := range bi.Deps {
		switch d.Path {
		case "k8s.io/client-go", "go.etcd.io/etcd/server/v3", "github.com/jackc/pgx/v5",
			"github.com/go-sql-driver/mysql", "modernc.org/sqlite":
			vs = append(vs, d.Path+"@"+d.Version)
		}
	}
	return strings.Join(vs, " ")
}

// writeJSON writes v, indented, to dir/name.
func writeJSON(dir, name string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", path)
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
