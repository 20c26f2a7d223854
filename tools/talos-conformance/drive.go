package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// callTimeout bounds each call to the node.
const callTimeout = 10 * time.Second

// mtlsWait is how long the node may take to come back behind mutual TLS after the apply.
const mtlsWait = 60 * time.Second

// driveArgs are the flags of `drive`.
type driveArgs struct {
	endpoint    string
	fingerprint string
	config      string
	bundle      string
}

func parseDriveArgs(args []string) (driveArgs, error) {
	var a driveArgs

	flags := flag.NewFlagSet("drive", flag.ContinueOnError)
	flags.StringVar(&a.endpoint, "endpoint", "", "the node, HOST[:PORT] (the port defaults to 50000)")
	flags.StringVar(&a.fingerprint, "fingerprint", "", "the maintenance certificate's fingerprint to pin")
	flags.StringVar(&a.config, "config", "", "the machine config to apply")
	flags.StringVar(&a.bundle, "bundle", "", "the secrets bundle the config was generated from")

	if err := flags.Parse(args); err != nil {
		return a, err
	}

	if flags.NArg() != 0 {
		return a, fmt.Errorf("unexpected arguments: %v", flags.Args())
	}

	for _, required := range []struct{ name, value string }{
		{"--endpoint", a.endpoint}, {"--fingerprint", a.fingerprint}, {"--config", a.config}, {"--bundle", a.bundle},
	} {
		if required.value == "" {
			return a, fmt.Errorf("%s is required", required.name)
		}
	}

	return a, nil
}

// drive takes a node in maintenance mode through what Ichor does to it, with Talos's own Go
// client: read it over the pinned maintenance connection, apply the config, then read it again
// over mutual TLS with the talosconfig Talos generates from the bundle. It prints one
// `key value` line per fact; a failed read is reported and the run goes on where later steps do
// not depend on it, and any failure makes it return an error.
func drive(a driveArgs) error {
	config, err := os.ReadFile(a.config)
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}

	// Built before anything touches the node, so that a bad bundle fails the run up front.
	talosconfig, err := generatedTalosconfig(a.bundle, a.endpoint)
	if err != nil {
		return err
	}

	var failures []string

	failed := func(step string, err error) bool {
		if err == nil {
			return false
		}

		fmt.Fprintf(os.Stderr, "drive: %s: %v\n", step, err)
		failures = append(failures, step)

		return true
	}

	// WithMaintenanceMode is what talosctl --insecure --cert-fingerprint uses: TLS without a
	// client certificate, chain verification replaced by the SPKI fingerprint pin.
	maintenance, err := client.New(context.Background(), client.WithMaintenanceMode(a.endpoint, []string{a.fingerprint}))
	if err != nil {
		return fmt.Errorf("maintenance client: %w", err)
	}

	defer maintenance.Close() //nolint:errcheck

	// The first call proves the pinned connection: nothing else is worth trying without it.
	if failed("version over the pinned maintenance connection", printVersion(maintenance, "version")) {
		return errors.New("the pinned maintenance connection failed")
	}

	failed("disks", printDisks(maintenance))
	failed("system information", printSystemInformation(maintenance))
	failed("machine status over the maintenance connection", printMachineStatus(maintenance, ""))

	if failed("apply", apply(maintenance, config)) {
		return fmt.Errorf("failed: %s", strings.Join(failures, ", "))
	}

	secure, err := waitForMutualTLS(talosconfig)
	if failed("mutual TLS", err) {
		return fmt.Errorf("failed: %s", strings.Join(failures, ", "))
	}

	defer secure.Close() //nolint:errcheck

	failed("machine status over mutual TLS", printMachineStatus(secure, "mtls-"))

	if len(failures) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failures, ", "))
	}

	return nil
}

// generatedTalosconfig is the admin talosconfig Talos generates from the bundle at path, with
// the node as its only endpoint.
func generatedTalosconfig(path, endpoint string) (*clientconfig.Config, error) {
	bundle, err := secrets.LoadBundle(path)
	if err != nil {
		return nil, fmt.Errorf("load the secrets bundle: %w", err)
	}

	host := endpoint
	if h, _, splitErr := net.SplitHostPort(endpoint); splitErr == nil {
		host = h
	}

	// The cluster endpoint and Kubernetes version shape the machine configs, not the
	// talosconfig; NewInput only needs them to be set.
	input, err := generate.NewInput("ichor", "https://"+net.JoinHostPort(host, "6443"), constants.DefaultKubernetesVersion,
		generate.WithSecretsBundle(bundle), generate.WithEndpointList([]string{endpoint}))
	if err != nil {
		return nil, fmt.Errorf("generate input: %w", err)
	}

	talosconfig, err := input.Talosconfig()
	if err != nil {
		return nil, fmt.Errorf("generate the talosconfig: %w", err)
	}

	return talosconfig, nil
}

// waitForMutualTLS polls until the node answers Version over mutual TLS, then prints it. Each
// attempt uses a new client, so that gRPC's reconnect backoff never outlasts the wait.
func waitForMutualTLS(talosconfig *clientconfig.Config) (*client.Client, error) {
	deadline := time.Now().Add(mtlsWait)

	for {
		c, err := client.New(context.Background(), client.WithConfig(talosconfig))
		if err != nil {
			return nil, fmt.Errorf("client from the generated talosconfig: %w", err)
		}

		err = printVersion(c, "mtls-version")
		if err == nil {
			return c, nil
		}

		c.Close() //nolint:errcheck

		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no answer within %s: %w", mtlsWait, err)
		}

		time.Sleep(time.Second)
	}
}

// printVersion prints the node's Talos version tag as `<key> <tag>`.
func printVersion(c *client.Client, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	resp, err := c.Version(ctx)
	if err != nil {
		return err
	}

	if len(resp.GetMessages()) != 1 {
		return fmt.Errorf("%d replies, want 1", len(resp.GetMessages()))
	}

	fmt.Printf("%s %s\n", key, resp.GetMessages()[0].GetVersion().GetTag())

	return nil
}

// printDisks prints `disk <name> <size in bytes>` per block device storage.StorageService
// lists.
func printDisks(c *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	resp, err := c.Disks(ctx)
	if err != nil {
		return err
	}

	for _, reply := range resp.GetMessages() {
		for _, disk := range reply.GetDisks() {
			fmt.Printf("disk %s %d\n", strings.TrimPrefix(disk.GetDeviceName(), "/dev/"), disk.GetSize())
		}
	}

	return nil
}

// printSystemInformation prints the SMBIOS UUID, decoded by Talos's own resource type (which
// reads the resource's protobuf spec).
func printSystemInformation(c *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	info, err := safe.StateGetByID[*hardware.SystemInformation](ctx, c.COSI, hardware.SystemInformationID)
	if err != nil {
		return err
	}

	uuid := info.TypedSpec().UUID
	if uuid == "" {
		return errors.New("the decoded spec has no uuid (Talos's client decodes the protobuf spec, not the YAML one)")
	}

	fmt.Printf("uuid %s\n", uuid)

	return nil
}

// printMachineStatus prints the machine's stage and readiness, decoded by Talos's own resource
// type, as `<prefix>stage` and `<prefix>ready`.
func printMachineStatus(c *client.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	status, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
	if err != nil {
		return err
	}

	spec := status.TypedSpec()

	fmt.Printf("%sstage %s\n", prefix, spec.Stage)
	fmt.Printf("%sready %t\n", prefix, spec.Status.Ready)

	if spec.Stage == runtime.MachineStageUnknown {
		return errors.New("the decoded stage is unknown (Talos's client decodes the protobuf spec, not the YAML one)")
	}

	return nil
}

// apply sends the config with mode NO_REBOOT and prints the mode the node used.
func apply(c *client.Client, config []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	resp, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
		Data: config,
		Mode: machine.ApplyConfigurationRequest_NO_REBOOT,
	})
	if err != nil {
		return err
	}

	if len(resp.GetMessages()) != 1 {
		return fmt.Errorf("%d replies, want 1", len(resp.GetMessages()))
	}

	fmt.Printf("applied-mode %s\n", resp.GetMessages()[0].GetMode())

	return nil
}
