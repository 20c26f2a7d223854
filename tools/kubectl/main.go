// Command kubectl is the upstream kubectl command, built here at the Kubernetes version of
// tools/k8s so that the tests drive the real client.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
