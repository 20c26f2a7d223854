package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/cosi-project/runtime/pkg/resource/meta"
)

// talosDefinitions are the resource definitions machined registers, by id (the lowercased
// type), each filled as COSI's registry fills it on registration (display type, automatic
// aliases).
func talosDefinitions() (map[string]meta.ResourceDefinitionSpec, error) {
	out := make(map[string]meta.ResourceDefinitionSpec, len(talosResources))

	for _, r := range talosResources {
		rd, err := meta.NewResourceDefinition(r.ResourceDefinition())
		if err != nil {
			return nil, fmt.Errorf("resource definition of %T: %w", r, err)
		}

		out[rd.Metadata().ID()] = *rd.TypedSpec()
	}

	return out, nil
}

// definitionLine is one line of `definitions`: a resource definition or a namespace.
type definitionLine struct {
	Kind        string                       `json:"kind"`
	ID          string                       `json:"id"`
	Definition  *meta.ResourceDefinitionSpec `json:"definition,omitempty"`
	Description string                       `json:"description,omitempty"`
}

// definitions prints, one JSON object a line, every namespace and resource definition machined
// registers: what a node's Namespaces.meta.cosi.dev and ResourceDefinitions.meta.cosi.dev hold.
func definitions() error {
	rds, err := talosDefinitions()
	if err != nil {
		return err
	}

	encoder := json.NewEncoder(os.Stdout)

	for _, ns := range talosNamespaces {
		if err = encoder.Encode(definitionLine{Kind: "namespace", ID: ns.name, Description: ns.description}); err != nil {
			return err
		}
	}

	for _, r := range talosResources {
		spec := rds[(&meta.ResourceDefinitionSpec{Type: r.ResourceDefinition().Type}).ID()]

		if err = encoder.Encode(definitionLine{Kind: "definition", ID: spec.ID(), Definition: &spec}); err != nil {
			return err
		}
	}

	return nil
}
