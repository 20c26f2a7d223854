// Package oracle answers questions about Talos artifacts with Talos's own code
// (pkg/machinery), so Ichor's hand-written Rust is checked against the real thing.
//
//	talos-oracle bundle        < secrets.yaml   load with secrets.LoadBundle, then validate
//	talos-oracle fingerprint   < cert.pem       the SPKI fingerprint talosctl pins
//	talos-oracle validate      < config.yaml    configloader + Validate (metal mode, strict)
//	talos-oracle apply         < request.json   what machined's ApplyConfiguration checks (see apply.go)
//	talos-oracle generate      < request.json   Talos's own config for the same inputs (YAML)
//	talos-oracle bench N       < request.json   how many configs per second Talos generates
//	talos-oracle secrets       < /dev/null      a new bundle, as talosctl gen secrets writes it
//
// Input on stdin. bundle, fingerprint and validate print a JSON result; generate prints YAML.
// Exit status 1 when Talos refuses the input, 2 on a usage or I/O error.
//
// Each tools/talos-oracle-<minor> module is a main package that calls Main with its contract
// and the Hooks of its machinery version (the bundle check and machined's apply-time validation,
// whose APIs differ between minors); Go's minimal version selection gives each the
// pkg/machinery version its own go.mod requires.
package oracle

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"go.yaml.in/yaml/v4"
)

type result struct {
	OK          bool         `json:"ok"`
	Error       string       `json:"error,omitempty"`
	Warnings    []string     `json:"warnings,omitempty"`
	Fingerprint string       `json:"fingerprint,omitempty"`
	PerSecond   float64      `json:"perSecond,omitempty"`
	Install     *installPlan `json:"install,omitempty"`
}

// request describes the inputs of a generated config, as Ichor's renderer receives them.
type request struct {
	Bundle            string   `json:"bundle"`
	ClusterName       string   `json:"clusterName"`
	Endpoint          string   `json:"endpoint"`
	KubernetesVersion string   `json:"kubernetesVersion"`
	Role              string   `json:"role"`
	InstallDisk       string   `json:"installDisk"`
	InstallImage      string   `json:"installImage"`
	PodSubnets        []string `json:"podSubnets"`
	ServiceSubnets    []string `json:"serviceSubnets"`
	DNSDomain         string   `json:"dnsDomain"`
	Patches           []string `json:"patches"`
}

// metal is the runtime mode of a bare-metal node: it installs to disk.
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// contractVersion is the version contract of the calling oracle, e.g. "v1.14.0".
var contractVersion string

// validateBundle runs the bundle's own checks (their signature differs between minors).
var validateBundle func(*secrets.Bundle) error

// Main runs the oracle command line for one contract.
func Main(contract string, hooks Hooks) {
	contractVersion = contract
	validateBundle = hooks.ValidateBundle
	runtimeValidate = hooks.RuntimeValidate
	unattendedSelector = hooks.UnattendedSelector

	if len(os.Args) < 2 {
		usage()
	}

	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}

	var res result

	switch os.Args[1] {
	case "bundle":
		res = checkBundle(input)
	case "fingerprint":
		res = fingerprint(input)
	case "validate":
		res = validate(input)
	case "apply":
		res = apply(input)
	case "generate":
		out, err := generateConfig(input)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}

		os.Stdout.Write(out) //nolint:errcheck

		return
	case "secrets":
		out, err := newSecrets()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}

		os.Stdout.Write(out) //nolint:errcheck

		return
	case "bench":
		if len(os.Args) != 3 {
			usage()
		}

		n, err := strconv.Atoi(os.Args[2])
		if err != nil || n < 1 {
			usage()
		}

		res = bench(input, n)
	default:
		usage()
	}

	out, _ := json.Marshal(res)
	fmt.Println(string(out))

	if !res.OK {
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: talos-oracle <bundle|fingerprint|validate|apply|generate|bench N|secrets> < input")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

// loadBundle loads a bundle exactly as talosctl loads a secrets.yaml file.
func loadBundle(yaml []byte) (*secrets.Bundle, error) {
	dir, err := os.MkdirTemp("", "talos-oracle-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir) //nolint:errcheck

	path := filepath.Join(dir, "secrets.yaml")
	if err = os.WriteFile(path, yaml, 0o600); err != nil {
		fail(err)
	}

	return secrets.LoadBundle(path)
}

func checkBundle(input []byte) result {
	bundle, err := loadBundle(input)
	if err != nil {
		return result{Error: "load: " + err.Error()}
	}

	if err = validateBundle(bundle); err != nil {
		return result{Error: "validate: " + err.Error()}
	}

	return result{OK: true}
}

func fingerprint(input []byte) result {
	fp, err := x509.SPKIFingerprintFromPEM(input)
	if err != nil {
		return result{Error: err.Error()}
	}

	return result{OK: true, Fingerprint: fp.String()}
}

func validate(input []byte) result {
	cfg, err := configloader.NewFromBytes(input)
	if err != nil {
		return result{Error: "load: " + err.Error()}
	}

	warnings, err := cfg.Validate(metal{}, validation.WithLocal(), validation.WithStrict())
	if err != nil {
		return result{Error: "validate: " + err.Error(), Warnings: warnings}
	}

	return result{OK: true, Warnings: warnings}
}

func parseRequest(input []byte) (request, *secrets.Bundle, error) {
	var req request
	if err := json.Unmarshal(input, &req); err != nil {
		return req, nil, fmt.Errorf("request: %w", err)
	}

	bundle, err := loadBundle([]byte(req.Bundle))
	if err != nil {
		return req, nil, fmt.Errorf("bundle: %w", err)
	}

	return req, bundle, nil
}

func generateConfig(input []byte) ([]byte, error) {
	req, bundle, err := parseRequest(input)
	if err != nil {
		return nil, err
	}

	return generateWith(req, bundle)
}

// generateWith runs Talos's generator and patcher, and encodes the result.
func generateWith(req request, bundle *secrets.Bundle) ([]byte, error) {
	contract, err := config.ParseContractFromVersion(contractVersion)
	if err != nil {
		return nil, err
	}

	opts := []generate.Option{
		generate.WithSecretsBundle(bundle),
		generate.WithVersionContract(contract),
	}
	if req.InstallDisk != "" {
		opts = append(opts, generate.WithInstallDisk(req.InstallDisk))
	}

	if req.InstallImage != "" {
		opts = append(opts, generate.WithInstallImage(req.InstallImage))
	}

	if req.DNSDomain != "" {
		opts = append(opts, generate.WithDNSDomain(req.DNSDomain))
	}

	in, err := generate.NewInput(req.ClusterName, req.Endpoint, req.KubernetesVersion, opts...)
	if err != nil {
		return nil, err
	}

	if len(req.PodSubnets) > 0 {
		in.PodNet = req.PodSubnets
	}

	if len(req.ServiceSubnets) > 0 {
		in.ServiceNet = req.ServiceSubnets
	}

	machineType, err := machine.ParseType(req.Role)
	if err != nil {
		return nil, err
	}

	cfg, err := in.Config(machineType)
	if err != nil {
		return nil, err
	}

	if len(req.Patches) > 0 {
		patches, err := configpatcher.LoadPatches(req.Patches)
		if err != nil {
			return nil, fmt.Errorf("patches: %w", err)
		}

		out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), patches)
		if err != nil {
			return nil, fmt.Errorf("patches: %w", err)
		}

		if cfg, err = out.Config(); err != nil {
			return nil, err
		}
	}

	return cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// bench times generation alone: the bundle is loaded once, as a renderer would hold it.
func bench(input []byte, n int) result {
	req, bundle, err := parseRequest(input)
	if err != nil {
		return result{Error: err.Error()}
	}

	start := time.Now()

	for range n {
		if _, err := generateWith(req, bundle); err != nil {
			return result{Error: err.Error()}
		}
	}

	return result{OK: true, PerSecond: float64(n) / time.Since(start).Seconds()}
}

// newSecrets generates a bundle with Talos's own code and marshals it as talosctl gen secrets
// does.
func newSecrets() ([]byte, error) {
	contract, err := config.ParseContractFromVersion(contractVersion)
	if err != nil {
		return nil, err
	}

	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), contract)
	if err != nil {
		return nil, err
	}

	return yaml.Marshal(bundle)
}
