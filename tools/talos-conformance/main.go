// Command talos-conformance keeps Ichor's Talos client honest against Talos's own code.
//
//	talos-conformance dump
//	talos-conformance fingerprint < cert.pem
//	talos-conformance drive --endpoint HOST[:PORT] --fingerprint F --config PATH --bundle PATH
//	talos-conformance snapshot-status FILE
//	talos-conformance definitions
//	talos-conformance resources --endpoint HOST[:PORT] (--insecure | --talosconfig PATH [--admin])
//
// `dump` prints, one per line, every service method, message field and enum value Talos
// registers in the packages Ichor's proto/ covers, in the canonical form Ichor's test compares
// its own descriptors to:
//
//	method <service> <name> <input> <output> <client-streaming> <server-streaming>
//	message <message>
//	field <message> <name> <number> <label> <type> [<type name>] [oneof=<name>] [optional]
//	value <enum> <name> <number>
//
// `fingerprint` prints the fingerprint talosctl --cert-fingerprint pins for a certificate
// (fingerprint.go). `drive` takes a node in maintenance mode through discovery, apply and the
// first mutual-TLS calls with Talos's own Go client, printing one `key value` line per fact
// (drive.go). `snapshot-status` checks an etcd snapshot file with bbolt's consistency check,
// etcdutl's snapshot status (what `talosctl etcd snapshot` prints) and etcdutl's restore
// (snapshot.go). `definitions` prints the namespaces and resource definitions machined
// registers, one JSON object a line (definitions.go, registry.go). `resources` checks a node's
// COSI state against Talos's own types: its definitions and namespaces, and every resource it
// serves, decoded from both spec encodings (resources.go).
//
// Exit status 1 when a command fails, 2 on a usage error.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	_ "github.com/cosi-project/runtime/api/v1alpha1"
	_ "github.com/siderolabs/talos/pkg/machinery/api/common"
	_ "github.com/siderolabs/talos/pkg/machinery/api/machine"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/config"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/block"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/cluster"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/enums"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/etcd"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/extensions"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/hardware"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/k8s"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/network"
	_ "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/runtime"
	_ "github.com/siderolabs/talos/pkg/machinery/api/storage"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// packages are the proto packages Ichor's proto/ folder covers.
var packages = map[string]bool{
	"common":             true,
	"machine":            true,
	"storage":            true,
	"cosi.resource":      true,
	"cosi.resource.meta": true,
	"google.rpc":         true,
	"resource.config":    true,

	"talos.resource.definitions.block":      true,
	"talos.resource.definitions.cluster":    true,
	"talos.resource.definitions.enums":      true,
	"talos.resource.definitions.etcd":       true,
	"talos.resource.definitions.extensions": true,
	"talos.resource.definitions.hardware":   true,
	"talos.resource.definitions.k8s":        true,
	"talos.resource.definitions.network":    true,
	"talos.resource.definitions.runtime":    true,
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}

	var err error

	switch os.Args[1] {
	case "dump":
		if len(os.Args) != 2 {
			usage()
		}

		dump()
	case "fingerprint":
		if len(os.Args) != 2 {
			usage()
		}

		err = fingerprint()
	case "definitions":
		if len(os.Args) != 2 {
			usage()
		}

		err = definitions()
	case "resources":
		args, parseErr := parseResourcesArgs(os.Args[2:])
		if parseErr != nil {
			fmt.Fprintln(os.Stderr, "talos-conformance resources:", parseErr)
			usage()
		}

		err = resources(args)
	case "drive":
		args, parseErr := parseDriveArgs(os.Args[2:])
		if parseErr != nil {
			fmt.Fprintln(os.Stderr, "talos-conformance drive:", parseErr)
			usage()
		}

		err = drive(args)
	case "snapshot-status":
		if len(os.Args) != 3 {
			usage()
		}

		err = snapshotStatus(os.Args[2])
	default:
		usage()
	}

	if err != nil {
		fmt.Fprintln(os.Stderr, "talos-conformance:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: talos-conformance dump | definitions | fingerprint < cert.pem | "+
		"drive --endpoint HOST[:PORT] --fingerprint F --config PATH --bundle PATH | "+
		"resources --endpoint HOST[:PORT] (--insecure | --talosconfig PATH [--admin]) | "+
		"snapshot-status FILE")
	os.Exit(2)
}

// dump prints the registered descriptors of the packages Ichor's proto/ covers.
func dump() {
	var lines []string

	protoregistry.GlobalFiles.RangeFiles(func(file protoreflect.FileDescriptor) bool {
		if !packages[string(file.Package())] {
			return true
		}

		services := file.Services()
		for i := range services.Len() {
			service := services.Get(i)
			methods := service.Methods()

			for j := range methods.Len() {
				m := methods.Get(j)
				lines = append(lines, fmt.Sprintf("method %s %s %s %s %t %t",
					service.FullName(), m.Name(), m.Input().FullName(), m.Output().FullName(),
					m.IsStreamingClient(), m.IsStreamingServer()))
			}
		}

		lines = appendMessages(lines, file.Messages())
		lines = appendEnums(lines, file.Enums())

		return true
	})

	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
}

func appendMessages(lines []string, messages protoreflect.MessageDescriptors) []string {
	for i := range messages.Len() {
		msg := messages.Get(i)
		if msg.IsMapEntry() {
			continue
		}

		lines = append(lines, fmt.Sprintf("message %s", msg.FullName()))

		fields := msg.Fields()
		for j := range fields.Len() {
			lines = append(lines, fieldLine(msg, fields.Get(j)))
		}

		lines = appendMessages(lines, msg.Messages())
		lines = appendEnums(lines, msg.Enums())
	}

	return lines
}

func appendEnums(lines []string, enums protoreflect.EnumDescriptors) []string {
	for i := range enums.Len() {
		enum := enums.Get(i)
		values := enum.Values()

		for j := range values.Len() {
			v := values.Get(j)
			lines = append(lines, fmt.Sprintf("value %s %s %d", enum.FullName(), v.Name(), v.Number()))
		}
	}

	return lines
}

func fieldLine(msg protoreflect.MessageDescriptor, f protoreflect.FieldDescriptor) string {
	label := f.Cardinality().String()
	kind := f.Kind().String()

	var parts []string

	parts = append(parts, "field", string(msg.FullName()), string(f.Name()), fmt.Sprint(f.Number()))

	switch {
	case f.IsMap():
		parts = append(parts, "map", fmt.Sprintf("%s:%s", typeName(f.MapKey()), typeName(f.MapValue())))
	default:
		parts = append(parts, label, kind)
		if f.Message() != nil || f.Enum() != nil {
			parts = append(parts, typeName(f))
		}
	}

	if oneof := f.ContainingOneof(); oneof != nil && !oneof.IsSynthetic() {
		parts = append(parts, "oneof="+string(oneof.Name()))
	}

	if f.HasOptionalKeyword() {
		parts = append(parts, "optional")
	}

	return strings.Join(parts, " ")
}

func typeName(f protoreflect.FieldDescriptor) string {
	switch {
	case f.Message() != nil:
		return string(f.Message().FullName())
	case f.Enum() != nil:
		return string(f.Enum().FullName())
	default:
		return f.Kind().String()
	}
}
