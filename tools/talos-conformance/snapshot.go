package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	snapshot "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// snapshotStatus checks an etcd snapshot file the way talosctl and etcd read one, printing one
// `key value` line per fact:
//
//   - the SHA-256 trailer talosctl looks for (size % 512 == 32) and whether it matches;
//   - bbolt's own consistency check (tx.Check) on the file, its page size, page count and
//     top-level buckets, the entries of `key` decoded as mvccpb.KeyValue, and the `meta`
//     values etcd 3.6 keeps;
//   - etcdutl's snapshot status (hash, revision, total keys, total size, storage version), the
//     numbers `talosctl etcd snapshot` prints;
//   - etcdutl's snapshot restore into a scratch directory, which checks the trailer again and
//     rewrites the membership with etcd's own backend.
func snapshotStatus(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}

	size := info.Size()
	if size%512 != sha256.Size {
		return fmt.Errorf("sha256 checksum not found (size %d)", size)
	}

	if err = checkTrailer(path, size); err != nil {
		return err
	}

	fmt.Printf("sha256 ok\n")

	if err = checkBolt(path); err != nil {
		return err
	}

	status, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return fmt.Errorf("snapshot status: %w", err)
	}

	fmt.Printf("hash %08x\n", status.Hash)
	fmt.Printf("revision %d\n", status.Revision)
	fmt.Printf("total-keys %d\n", status.TotalKey)
	fmt.Printf("total-size %d\n", status.TotalSize)
	fmt.Printf("version %s\n", status.Version)

	dir, err := os.MkdirTemp("", "snapshot-restore-")
	if err != nil {
		return err
	}

	defer os.RemoveAll(dir) //nolint:errcheck

	if err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:   path,
		Name:           "restore",
		OutputDataDir:  filepath.Join(dir, "etcd"),
		PeerURLs:       []string{"https://127.0.0.1:2380"},
		InitialCluster: "restore=https://127.0.0.1:2380",
	}); err != nil {
		return fmt.Errorf("snapshot restore: %w", err)
	}

	fmt.Printf("restore ok\n")

	return nil
}

func checkTrailer(path string, size int64) error {
	file, err := os.ReadFile(path)
	if err != nil {
		return err
	}

	sum := sha256.Sum256(file[:size-sha256.Size])
	if !bytes.Equal(sum[:], file[size-sha256.Size:]) {
		return fmt.Errorf("the sha256 trailer does not match the database")
	}

	return nil
}

func checkBolt(path string) error {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("bbolt open: %w", err)
	}

	defer db.Close() //nolint:errcheck

	return db.View(func(tx *bolt.Tx) error {
		var problems []string
		for problem := range tx.Check() {
			problems = append(problems, problem.Error())
		}

		if len(problems) > 0 {
			return fmt.Errorf("bbolt check: %d errors:\n%s", len(problems), strings.Join(problems, "\n"))
		}

		fmt.Printf("bbolt-check ok\n")
		fmt.Printf("page-size %d\n", db.Info().PageSize)
		fmt.Printf("pages %d\n", tx.Size()/int64(db.Info().PageSize))

		var buckets []string
		if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			buckets = append(buckets, string(name))

			return nil
		}); err != nil {
			return err
		}

		sort.Strings(buckets)
		fmt.Printf("buckets %s\n", strings.Join(buckets, ","))

		key := tx.Bucket([]byte("key"))
		if key == nil {
			return fmt.Errorf("no key bucket")
		}

		stats := key.Stats()
		fmt.Printf("key-depth %d\n", stats.Depth)
		fmt.Printf("key-branch-pages %d\n", stats.BranchPageN)
		fmt.Printf("key-overflow-pages %d\n", stats.LeafOverflowN)

		entries, registry, tombstones := 0, 0, 0
		if err := key.ForEach(func(k, v []byte) error {
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(v, &kv); err != nil {
				return fmt.Errorf("entry %x: %w", k, err)
			}

			entries++

			if len(k) == 18 && k[17] == 't' {
				tombstones++
			} else if kv.ModRevision != int64(binary.BigEndian.Uint64(k[:8])) {
				return fmt.Errorf("entry %x: mod revision %d", k, kv.ModRevision)
			}

			if strings.HasPrefix(string(kv.Key), "/registry/") {
				registry++
			}

			return nil
		}); err != nil {
			return err
		}

		fmt.Printf("key-entries %d\n", entries)
		fmt.Printf("key-registry %d\n", registry)
		fmt.Printf("key-tombstones %d\n", tombstones)

		meta := tx.Bucket([]byte("meta"))
		if meta == nil {
			return fmt.Errorf("no meta bucket")
		}

		for _, name := range []string{"consistent_index", "term"} {
			v := meta.Get([]byte(name))
			if len(v) != 8 {
				return fmt.Errorf("meta %s: %d bytes", name, len(v))
			}

			fmt.Printf("%s %d\n", strings.ReplaceAll(name, "_", "-"), binary.BigEndian.Uint64(v))
		}

		fmt.Printf("storage-version %s\n", meta.Get([]byte("storageVersion")))
		fmt.Printf("conf-state %s\n", meta.Get([]byte("confState")))

		members := 0
		if b := tx.Bucket([]byte("members")); b != nil {
			members = b.Stats().KeyN
		}

		fmt.Printf("members %d\n", members)

		return nil
	})
}
