// Checks Ichor's hand-written Talos API (proto/) against the descriptors Talos's own Go code
// registers (pkg/machinery v1.14.1, as the 1.14 oracle) and the COSI runtime's.
module ichor.invalid/tools/talos-conformance

go 1.26.5

require (
	github.com/cosi-project/runtime v1.16.3
	github.com/siderolabs/talos/pkg/machinery v1.14.1
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20260702190614-8ae5a48058df // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260810153831-ec0a7760b754 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260810153831-ec0a7760b754 // indirect
	google.golang.org/grpc v1.83.2 // indirect
)

// Versions the module proxy serves in place of ones it does not (see docs/adr/0004).
replace github.com/cosi-project/runtime => github.com/cosi-project/runtime v1.16.2

replace github.com/mdlayher/ethtool => github.com/siderolabs/ethtool v0.4.0-sidero

replace github.com/jsimonetti/rtnetlink/v2 => github.com/jsimonetti/rtnetlink/v2 v2.2.1-0.20260317095713-310581b9c6ac
