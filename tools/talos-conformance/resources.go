package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/resource/meta/spec"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"go.yaml.in/yaml/v4"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// resourcesArgs are the flags of `resources`.
type resourcesArgs struct {
	endpoint    string
	insecure    bool
	talosconfig string
	admin       bool
}

func parseResourcesArgs(args []string) (resourcesArgs, error) {
	var a resourcesArgs

	flags := flag.NewFlagSet("resources", flag.ContinueOnError)
	flags.StringVar(&a.endpoint, "endpoint", "", "the node, HOST[:PORT] (the port defaults to 50000)")
	flags.BoolVar(&a.insecure, "insecure", false, "connect as talosctl --insecure does (maintenance mode)")
	flags.StringVar(&a.talosconfig, "talosconfig", "", "connect with this talosconfig (its context's credentials)")
	flags.BoolVar(&a.admin, "admin", false, "the credentials hold os:admin: sensitive types must be readable")

	if err := flags.Parse(args); err != nil {
		return a, err
	}

	switch {
	case flags.NArg() != 0:
		return a, fmt.Errorf("unexpected arguments: %v", flags.Args())
	case a.endpoint == "":
		return a, errors.New("--endpoint is required")
	case a.insecure == (a.talosconfig != ""):
		return a, errors.New("exactly one of --insecure and --talosconfig is required")
	case a.insecure && a.admin:
		return a, errors.New("--admin needs --talosconfig: maintenance mode grants every caller os:reader")
	}

	return a, nil
}

// checker collects the failures of one run.
type checker struct {
	failures []string
}

func (c *checker) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "resources:", msg)
	c.failures = append(c.failures, msg)
}

// resources connects to a node with Talos's own Go client and checks what its COSI state
// serves against Talos's own types: every resource definition and namespace equals the one
// machined registers, and every resource of every served type decodes with Talos's resource
// registry from its protobuf spec (with no field Talos does not know), marshals with Talos's
// types back to exactly the YAML spec served, and has sound metadata; Get and Watch agree with
// List, and the access policy answers as Talos's does. It prints one `key value...` line per
// fact and fails when anything differs.
func resources(a resourcesArgs) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var opts []client.OptionFunc

	if a.insecure {
		opts = append(opts, client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec
	} else {
		opts = append(opts, client.WithConfigFromFile(a.talosconfig))
	}

	opts = append(opts, client.WithEndpoints(a.endpoint))

	c, err := client.New(ctx, opts...)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	defer c.Close() //nolint:errcheck

	talosRDs, err := talosDefinitions()
	if err != nil {
		return err
	}

	var ch checker

	served := checkDefinitions(ctx, c, talosRDs, &ch)
	checkNamespaces(ctx, c, &ch)

	for _, rd := range served {
		checkType(ctx, c, rd, a.admin, &ch)
	}

	checkRefusals(ctx, c, talosRDs, served, &ch)

	if len(ch.failures) > 0 {
		return fmt.Errorf("%d mismatches", len(ch.failures))
	}

	return nil
}

// checkDefinitions compares every served resource definition with Talos's, and returns them.
func checkDefinitions(ctx context.Context, c *client.Client, talosRDs map[string]meta.ResourceDefinitionSpec, ch *checker) []meta.ResourceDefinitionSpec {
	rds, err := safe.StateListAll[*meta.ResourceDefinition](ctx, c.COSI)
	if err != nil {
		ch.fail("list resource definitions: %v", err)

		return nil
	}

	var served []meta.ResourceDefinitionSpec

	for rd := range rds.All() {
		spec := *rd.TypedSpec()
		id := rd.Metadata().ID()

		want, ok := talosRDs[id]
		if !ok {
			ch.fail("definition %s: Talos registers no such type", id)

			continue
		}

		if id != want.ID() {
			ch.fail("definition %s: id, want %s", id, want.ID())
		}

		if diff := definitionDiff(spec, want); diff != "" {
			ch.fail("definition %s differs from Talos's: %s", id, diff)
		}

		fmt.Printf("definition %s %s %s\n", id, spec.DefaultNamespace, sensitivityWord(spec.Sensitivity))

		served = append(served, spec)
	}

	if len(served) == 0 {
		ch.fail("no resource definitions served")
	}

	return served
}

func sensitivityWord(s spec.Sensitivity) string {
	if s == meta.Sensitive {
		return "sensitive"
	}

	return "non-sensitive"
}

// definitionDiff names the fields in which two definitions differ.
func definitionDiff(got, want meta.ResourceDefinitionSpec) string {
	var diffs []string

	check := func(name string, g, w any) {
		if !reflect.DeepEqual(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s %v, want %v", name, g, w))
		}
	}

	check("type", got.Type, want.Type)
	check("displayType", got.DisplayType, want.DisplayType)
	check("defaultNamespace", got.DefaultNamespace, want.DefaultNamespace)
	check("aliases", got.Aliases, want.Aliases)
	check("allAliases", got.AllAliases, want.AllAliases)
	check("printColumns", normalizeColumns(got.PrintColumns), normalizeColumns(want.PrintColumns))
	check("sensitivity", got.Sensitivity, want.Sensitivity)

	return strings.Join(diffs, "; ")
}

// normalizeColumns treats no columns and an empty list alike (the wire cannot tell them apart).
func normalizeColumns(columns []meta.PrintColumn) []meta.PrintColumn {
	if len(columns) == 0 {
		return nil
	}

	return columns
}

// checkNamespaces compares the served namespaces with the ones machined registers.
func checkNamespaces(ctx context.Context, c *client.Client, ch *checker) {
	namespaces, err := safe.StateListAll[*meta.Namespace](ctx, c.COSI)
	if err != nil {
		ch.fail("list namespaces: %v", err)

		return
	}

	got := map[string]string{}

	for ns := range namespaces.All() {
		got[ns.Metadata().ID()] = ns.TypedSpec().Description
	}

	for _, want := range talosNamespaces {
		description, ok := got[want.name]

		switch {
		case !ok:
			ch.fail("namespace %s: not served", want.name)
		case description != want.description:
			ch.fail("namespace %s: description %q, want %q", want.name, description, want.description)
		default:
			fmt.Printf("namespace %s\n", want.name)
		}

		delete(got, want.name)
	}

	for name := range got {
		ch.fail("namespace %s: Talos registers no such namespace", name)
	}
}

// specMessage is the protobuf message of a resource type's spec: the message named after the
// Go spec type in the package named after the Go package (`talos.resource.definitions.block.
// DiskSpec` for block.DiskSpec), except for the types that marshal their spec by hand.
func specMessage(r resource.Resource) protoreflect.FullName {
	switch r.Metadata().Type() {
	case meta.ResourceDefinitionType:
		return "cosi.resource.meta.ResourceDefinitionSpec"
	case meta.NamespaceType:
		return "cosi.resource.meta.NamespaceSpec"
	case config.MachineConfigType:
		return "resource.config.MachineConfigSpec"
	case config.MachineTypeType:
		return "resource.config.MachineTypeSpec"
	}

	t := reflect.TypeOf(r.Spec())
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}

	pkg := t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:]

	return protoreflect.FullName("talos.resource.definitions." + pkg + "." + t.Name())
}

// unknownFields lists the fields of m (and its nested messages) Talos's message does not
// define.
func unknownFields(m protoreflect.Message, path string) []string {
	var out []string

	if len(m.GetUnknown()) > 0 {
		out = append(out, path+": unknown fields")
	}

	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || fd.IsMap() {
			return true
		}

		if fd.IsList() {
			list := v.List()
			for i := range list.Len() {
				out = append(out, unknownFields(list.Get(i).Message(), fmt.Sprintf("%s.%s[%d]", path, fd.Name(), i))...)
			}

			return true
		}

		out = append(out, unknownFields(v.Message(), path+"."+string(fd.Name()))...)

		return true
	})

	return out
}

// checkResource decodes one served resource with Talos's types and checks both encodings and
// its metadata.
func checkResource(raw *protobuf.Resource, rd meta.ResourceDefinitionSpec, ch *checker) {
	wire, err := raw.Marshal()
	if err != nil {
		ch.fail("%s: marshal: %v", rd.Type, err)

		return
	}

	md := wire.GetMetadata()
	key := fmt.Sprintf("%s %s/%s", rd.Type, md.GetNamespace(), md.GetId())

	typed, err := protobuf.UnmarshalResource(raw)
	if err != nil {
		ch.fail("%s: Talos's registry cannot decode the protobuf spec: %v", key, err)

		return
	}

	if _, isProto := typed.(*protobuf.Resource); isProto {
		ch.fail("%s: Talos's registry has no type for it", key)

		return
	}

	name := specMessage(typed)

	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		ch.fail("%s: no spec message %s: %v", key, name, err)
	} else {
		msg := mt.New()
		if err = proto.Unmarshal(wire.GetSpec().GetProtoSpec(), msg.Interface()); err != nil {
			ch.fail("%s: proto_spec is no %s: %v", key, name, err)
		}

		for _, unknown := range unknownFields(msg, string(name)) {
			ch.fail("%s: %s", key, unknown)
		}
	}

	talosYAML, err := yaml.Marshal(typed.Spec())
	if err != nil {
		ch.fail("%s: Talos's type cannot marshal the decoded spec: %v", key, err)
	} else if string(talosYAML) != wire.GetSpec().GetYamlSpec() {
		ch.fail("%s: yaml_spec differs from Talos's YAML of the protobuf spec:\n--- served\n%s--- Talos\n%s",
			key, wire.GetSpec().GetYamlSpec(), talosYAML)
	}

	checkYAMLDecodes(key, typed, wire.GetSpec().GetYamlSpec(), ch)

	checkMetadata(key, md, rd, ch)

	fmt.Printf("resource %s %s %s\n", rd.Type, md.GetNamespace()+"/"+md.GetId(), md.GetVersion())
}

// checkYAMLDecodes decodes the YAML spec into a zero spec of Talos's type, and checks the
// decoded spec marshals back to the same YAML. MachineConfigs, MachineTypes, Manifests and
// StaticPodStatuses only marshal to YAML (their MarshalYAML writes the config, the type, the
// list of objects and the pod status; nothing reads them back).
func checkYAMLDecodes(key string, typed resource.Resource, yamlSpec string, ch *checker) {
	switch typed.Metadata().Type() {
	case config.MachineConfigType, config.MachineTypeType, k8s.ManifestType, k8s.StaticPodStatusType:
		return
	}

	specType := reflect.TypeOf(typed.Spec())
	if specType.Kind() != reflect.Pointer {
		ch.fail("%s: spec %s is no pointer", key, specType)

		return
	}

	fresh := reflect.New(specType.Elem()).Interface()

	if err := yaml.Unmarshal([]byte(yamlSpec), fresh); err != nil {
		ch.fail("%s: Talos's type cannot decode the yaml_spec: %v", key, err)

		return
	}

	again, err := yaml.Marshal(fresh)
	if err != nil || string(again) != yamlSpec {
		ch.fail("%s: the yaml_spec does not survive Talos's type: %v\n%s", key, err, again)
	}
}

func checkMetadata(key string, md *cosiv1alpha1.Metadata, rd meta.ResourceDefinitionSpec, ch *checker) {
	if md.GetType() != rd.Type {
		ch.fail("%s: metadata type %q", key, md.GetType())
	}

	if version, err := strconv.ParseUint(md.GetVersion(), 10, 64); err != nil || version < 1 {
		ch.fail("%s: version %q is no counter", key, md.GetVersion())
	}

	if md.GetPhase() != "running" {
		ch.fail("%s: phase %q", key, md.GetPhase())
	}

	if md.GetCreated() == nil || md.GetUpdated() == nil || md.GetUpdated().AsTime().Before(md.GetCreated().AsTime()) {
		ch.fail("%s: created %v, updated %v", key, md.GetCreated(), md.GetUpdated())
	}

	if md.GetId() == "" {
		ch.fail("%s: no id", key)
	}
}

// isNotAuthorized reports whether err is Talos's authorization refusal.
func isNotAuthorized(err error) bool {
	return status.Code(err) == codes.PermissionDenied && status.Convert(err).Message() == "not authorized"
}

// checkType lists, gets and watches every resource of a served type in its default namespace.
func checkType(ctx context.Context, c *client.Client, rd meta.ResourceDefinitionSpec, admin bool, ch *checker) {
	kind := resource.NewMetadata(rd.DefaultNamespace, rd.Type, "", resource.VersionUndefined)

	items, err := c.COSI.List(ctx, kind, state.WithListUnmarshalOptions(state.WithSkipProtobufUnmarshal()))

	if rd.Sensitivity == meta.Sensitive && !admin {
		if !isNotAuthorized(err) {
			ch.fail("%s: sensitive, listed without os:admin: %v", rd.Type, err)
		} else {
			fmt.Printf("refused %s not-authorized\n", rd.Type)
		}

		return
	}

	if err != nil {
		ch.fail("%s: list: %v", rd.Type, err)

		return
	}

	listed := map[string]*protobuf.Resource{}

	for _, item := range items.Items {
		raw, ok := item.(*protobuf.Resource)
		if !ok {
			ch.fail("%s: list item %T", rd.Type, item)

			continue
		}

		listed[raw.Metadata().ID()] = raw

		checkResource(raw, rd, ch)
		checkGet(ctx, c, raw, ch)
	}

	checkWatch(ctx, c, rd, listed, ch)
}

// checkGet gets a listed resource by id and compares it with the listed one.
func checkGet(ctx context.Context, c *client.Client, listed *protobuf.Resource, ch *checker) {
	got, err := c.COSI.Get(ctx, listed.Metadata(), state.WithGetUnmarshalOptions(state.WithSkipProtobufUnmarshal()))
	if err != nil {
		ch.fail("%s: get: %v", listed, err)

		return
	}

	raw, ok := got.(*protobuf.Resource)
	if !ok {
		ch.fail("%s: get returned %T", listed, got)

		return
	}

	gotWire, err := raw.Marshal()
	if err != nil {
		ch.fail("%s: %v", listed, err)

		return
	}

	listedWire, err := listed.Marshal()
	if err != nil {
		ch.fail("%s: %v", listed, err)

		return
	}

	if gotWire.GetMetadata().GetVersion() == listedWire.GetMetadata().GetVersion() &&
		(gotWire.GetSpec().GetYamlSpec() != listedWire.GetSpec().GetYamlSpec() ||
			!bytes.Equal(gotWire.GetSpec().GetProtoSpec(), listedWire.GetSpec().GetProtoSpec())) {
		ch.fail("%s: get and list give different specs at the same version", listed)
	}
}

// checkWatch watches the whole type with bootstrap contents, as `talosctl get -w` does, and
// compares the bootstrap with the list.
func checkWatch(ctx context.Context, c *client.Client, rd meta.ResourceDefinitionSpec, listed map[string]*protobuf.Resource, ch *checker) {
	watchCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	events := make(chan state.Event)

	err := c.COSI.WatchKind(watchCtx, resource.NewMetadata(rd.DefaultNamespace, rd.Type, "", resource.VersionUndefined), events,
		state.WithBootstrapContents(true), state.WithWatchKindUnmarshalOptions(state.WithSkipProtobufUnmarshal()))
	if err != nil {
		ch.fail("%s: watch: %v", rd.Type, err)

		return
	}

	var bootstrapped []string

	for {
		select {
		case <-watchCtx.Done():
			ch.fail("%s: watch: no BOOTSTRAPPED event", rd.Type)

			return
		case ev := <-events:
			switch ev.Type { //nolint:exhaustive
			case state.Created:
				bootstrapped = append(bootstrapped, ev.Resource.Metadata().ID())
			case state.Bootstrapped:
				var want []string
				for id := range listed {
					want = append(want, id)
				}

				slices.Sort(want)

				if !slices.IsSorted(bootstrapped) {
					ch.fail("%s: watch bootstrap %v not sorted by id", rd.Type, bootstrapped)
				}

				if !slices.Equal(bootstrapped, want) {
					ch.fail("%s: watch bootstrap %v, list %v", rd.Type, bootstrapped, want)
				}

				fmt.Printf("watched %s %d\n", rd.Type, len(bootstrapped))

				return
			case state.Errored:
				ch.fail("%s: watch: %v", rd.Type, ev.Error)

				return
			default:
				// Updates and destroys racing the bootstrap are fine.
			}
		}
	}
}

// checkRefusals checks the access policy's answers for a type Talos registers but the node
// does not serve, and for an unknown namespace.
func checkRefusals(ctx context.Context, c *client.Client, talosRDs map[string]meta.ResourceDefinitionSpec, served []meta.ResourceDefinitionSpec, ch *checker) {
	isServed := map[string]bool{}
	for _, rd := range served {
		isServed[rd.ID()] = true
	}

	var unserved []string

	for id := range talosRDs {
		if !isServed[id] {
			unserved = append(unserved, id)
		}
	}

	slices.Sort(unserved)

	if len(unserved) > 0 {
		rd := talosRDs[unserved[0]]

		_, err := c.COSI.List(ctx, resource.NewMetadata(rd.DefaultNamespace, rd.Type, "", resource.VersionUndefined))
		want := fmt.Sprintf("resource type %q is not supported", rd.Type)

		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != want {
			ch.fail("unserved type %s: %v, want PermissionDenied %q", rd.Type, err, want)
		} else {
			fmt.Printf("refused %s not-supported\n", rd.Type)
		}
	}

	if len(served) > 0 {
		rd := served[0]

		_, err := c.COSI.List(ctx, resource.NewMetadata("no-such-namespace", rd.Type, "", resource.VersionUndefined))
		want := `namespace "no-such-namespace" is not supported`

		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != want {
			ch.fail("unknown namespace: %v, want PermissionDenied %q", err, want)
		} else {
			fmt.Println("refused namespace not-supported")
		}
	}
}
