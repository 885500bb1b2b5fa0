//go:build unix

package pgtest

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// copyBackup is pg_basebackup -R for a server whose binaries lack it (the
// PostgreSQL 17 binaries of the npm package have initdb and postgres only): a
// low-level base backup of c into data, on this machine. Between
// pg_backup_start and pg_backup_stop it copies c's data directory, without what
// a base backup leaves out (docs: "Making a Base Backup Using the Low Level
// API"); then it copies the WAL written meanwhile, writes the backup label and
// marks the copy a standby (standby.signal; primary_conninfo is a setting of
// the standby's server). The primary keeps enough WAL for the standby to
// connect (wal_keep_size), since no slot holds it.
func (c *Cluster) copyBackup(ctx context.Context, data string) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: copy backup: connect to primary: %w", err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{"ALTER SYSTEM SET wal_keep_size = '512MB'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgtest: copy backup: %s: %w", q, err)
		}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_backup_start('pgtest standby', true)"); err != nil {
		return fmt.Errorf("pgtest: copy backup: pg_backup_start: %w", err)
	}
	src := filepath.Join(c.dir, "data")
	if err := c.copyTree(src, data, skipInBackup); err != nil {
		return err
	}
	var label, spcmap string
	if err := conn.QueryRow(ctx, "SELECT labelfile, spcmapfile FROM pg_backup_stop(true)").Scan(&label, &spcmap); err != nil {
		return fmt.Errorf("pgtest: copy backup: pg_backup_stop: %w", err)
	}
	// The WAL from the backup's start to its end (the standby streams the rest).
	if err := c.copyTree(filepath.Join(src, "pg_wal"), filepath.Join(data, "pg_wal"), skipInWAL); err != nil {
		return err
	}
	files := map[string]string{"backup_label": label, "standby.signal": ""}
	if spcmap != "" {
		files["tablespace_map"] = spcmap
	}
	for name, body := range files {
		if err := c.writeOwned(filepath.Join(data, name), []byte(body)); err != nil {
			return err
		}
	}
	return nil
}

// skipInBackup: what a base backup leaves out of a data directory (its
// contents for the folders, which it keeps empty).
func skipInBackup(rel string, dir bool) bool {
	switch rel {
	case "postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map", "standby.signal", "recovery.signal", "log":
		return true
	}
	for _, d := range []string{"pg_wal", "pg_replslot", "pg_stat_tmp", "pg_dynshmem", "pg_notify", "pg_serial", "pg_snapshots", "pg_subtrans"} {
		if strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// skipInWAL keeps the WAL segments and history files only.
func skipInWAL(rel string, dir bool) bool { return dir || strings.Contains(rel, "/") }

// copyTree copies src into dst (created), files and folders owned by the
// cluster's OS user, skipping what skip says (rel is the slash path under src).
func (c *Cluster) copyTree(src, dst string, skip func(rel string, dir bool) bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p != src { // removed while copying: a recycled segment, a temp file
				return nil
			}
			return fmt.Errorf("pgtest: copy backup: %w", err)
		}
		rel, _ := filepath.Rel(src, p)
		rel = filepath.ToSlash(rel)
		if rel != "." && skip(rel, d.IsDir()) {
			return nil
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		if d.IsDir() {
			if err := os.MkdirAll(target, 0o700); err != nil {
				return fmt.Errorf("pgtest: copy backup: %w", err)
			}
			return c.own(target)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("pgtest: copy backup: %w", err)
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("pgtest: copy backup: %w", err)
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("pgtest: copy backup: %s: %w", rel, err)
		}
		if err := out.Close(); err != nil {
			return fmt.Errorf("pgtest: copy backup: %w", err)
		}
		return c.own(target)
	})
}

func (c *Cluster) writeOwned(path string, body []byte) error {
	if err := os.WriteFile(path, body, 0o600); err != nil {
		return fmt.Errorf("pgtest: copy backup: %w", err)
	}
	return c.own(path)
}

// own gives path to the cluster's OS user (when the tests run as root).
func (c *Cluster) own(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Lchown(path, int(c.cred.uid), int(c.cred.gid)); err != nil {
		return fmt.Errorf("pgtest: copy backup: %w", err)
	}
	return nil
}
