package main

import "testing"

// The CPU columns count only the MariaDB the benchmark talks to: another
// server on the machine (a test's, a private one) is the rest of the machine.
func TestServesPort(t *testing.T) {
	for _, c := range []struct {
		cmdline, port string
		want          bool
	}{
		{"/usr/sbin/mariadbd\x00--user=mysql\x00--port=3306\x00", "3306", true},
		{"/usr/sbin/mariadbd\x00--port=3317\x00", "3306", false},
		{"/usr/sbin/mariadbd\x00--port=3317\x00", "3317", true},
		{"/usr/sbin/mariadbd\x00--user=mysql\x00", "3306", true},
		{"/usr/sbin/mariadbd\x00--user=mysql\x00", "3317", false},
	} {
		if got := servesPort([]byte(c.cmdline), c.port); got != c.want {
			t.Errorf("servesPort(%q, %s) = %v, want %v", c.cmdline, c.port, got, c.want)
		}
	}
	for dsn, want := range map[string]string{
		"inventory:inventory@tcp(127.0.0.1:3306)/": "3306",
		"inventory:inventory@tcp(127.0.0.1:3317)/": "3317",
		"inventory:inventory@tcp(localhost)/":      "3306",
	} {
		if got := dsnPort(dsn); got != want {
			t.Errorf("dsnPort(%q) = %s, want %s", dsn, got, want)
		}
	}
}

// The floor writes the selling phase's mean batch, rounded, never empty.
func TestMeanBatch(t *testing.T) {
	for _, c := range []struct {
		requests, commits int64
		want              int
	}{{11757, 806, 15}, {0, 0, 1}, {3, 10, 1}, {64, 1, 64}} {
		if got := meanBatch(c.requests, c.commits); got != c.want {
			t.Errorf("meanBatch(%d, %d) = %d, want %d", c.requests, c.commits, got, c.want)
		}
	}
}

// The variants' statements: n rows of k placeholders.
func TestValuesOf(t *testing.T) {
	if got := valuesOf(2, 3); got != "(?, ?, ?), (?, ?, ?)" {
		t.Fatalf("valuesOf(2, 3) = %q", got)
	}
	if got := valuesOf(1, 1); got != "(?)" {
		t.Fatalf("valuesOf(1, 1) = %q", got)
	}
	for _, v := range costVariants() {
		if v.rows < 0 || v.entries < v.rows || v.trips < 3 || len(v.steps) == 0 {
			t.Errorf("%s: %+v", v.name, v)
		}
	}
}
