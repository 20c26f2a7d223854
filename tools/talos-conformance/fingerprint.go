package main

import (
	"fmt"
	"io"
	"os"

	"github.com/siderolabs/crypto/x509"
)

// fingerprint prints the fingerprint talosctl pins with --cert-fingerprint for the PEM
// certificate on stdin: Talos's own x509.SPKIFingerprintFromPEM, the function whose result
// the client's maintenance-mode pin (x509.MatchSPKIFingerprints) compares against.
func fingerprint() error {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}

	fp, err := x509.SPKIFingerprintFromPEM(input)
	if err != nil {
		return fmt.Errorf("fingerprint: %w", err)
	}

	fmt.Println(fp.String())

	return nil
}
