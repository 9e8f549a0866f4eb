package pgtest

import "testing"

func TestDatabaseAndRoleWithIsolation(t *testing.T) {
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			// Both check that a new session starts with level.
			if dsn := DatabaseWithIsolation(t, level); dsn == DSN() {
				t.Fatal("DatabaseWithIsolation returned the shared database")
			}
			RoleWithIsolation(t, level)
		})
	}
}

func TestDSNRewriting(t *testing.T) {
	for _, tc := range []struct{ dsn, db, user, wantDB, wantUser string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "d", "u",
			"postgres://postgres@127.0.0.1:5432/d?sslmode=disable", "postgres://u@127.0.0.1:5432/test?sslmode=disable"},
		{"host=127.0.0.1 user=postgres dbname=test", "d", "u",
			"host=127.0.0.1 user=postgres dbname=test dbname=d", "host=127.0.0.1 user=postgres dbname=test user=u password=''"},
	} {
		if got := WithDatabase(tc.dsn, tc.db); got != tc.wantDB {
			t.Errorf("WithDatabase(%q) = %q, want %q", tc.dsn, got, tc.wantDB)
		}
		if got := WithUser(tc.dsn, tc.user); got != tc.wantUser {
			t.Errorf("WithUser(%q) = %q, want %q", tc.dsn, got, tc.wantUser)
		}
	}
}
