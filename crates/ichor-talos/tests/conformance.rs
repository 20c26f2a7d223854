//! `proto/` against the descriptors Talos's own Go code registers (tools/talos-conformance):
//! every service method, message field and enum value we wrote must be exactly Talos's —
//! package, name, number, type and label.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

/// Canonical lines per entity (`message X`, `enum X`, `method S M`), in the dump's format.
type Entities = BTreeMap<String, BTreeSet<String>>;

fn type_word(t: Type) -> &'static str {
    match t {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Group => "group",
        Type::Message => "message",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Enum => "enum",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
    }
}

fn strip(name: &str) -> &str {
    name.trim_start_matches('.')
}

/// Our descriptors in the dump's canonical form.
fn ours() -> Entities {
    let fds = FileDescriptorSet::decode(ichor_talos::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let mut out = Entities::new();
    for file in &fds.file {
        let package = file.package();
        if package.starts_with("google.protobuf") {
            continue;
        }
        for service in &file.service {
            for method in &service.method {
                let service_name = format!("{package}.{}", service.name());
                out.entry(format!("method {service_name} {}", method.name()))
                    .or_default()
                    .insert(format!(
                        "method {service_name} {} {} {} {} {}",
                        method.name(),
                        strip(method.input_type()),
                        strip(method.output_type()),
                        method.client_streaming(),
                        method.server_streaming()
                    ));
            }
        }
        for message in &file.message_type {
            add_message(&mut out, package, message);
        }
        for enumeration in &file.enum_type {
            add_enum(&mut out, package, enumeration);
        }
    }
    out
}

fn add_enum(out: &mut Entities, scope: &str, enumeration: &EnumDescriptorProto) {
    let name = format!("{scope}.{}", enumeration.name());
    let lines = out.entry(format!("enum {name}")).or_default();
    for value in &enumeration.value {
        lines.insert(format!("value {name} {} {}", value.name(), value.number()));
    }
}

fn add_message(out: &mut Entities, scope: &str, message: &DescriptorProto) {
    let name = format!("{scope}.{}", message.name());
    let maps: BTreeMap<String, &DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|n| n.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|n| (format!("{name}.{}", n.name()), n))
        .collect();
    let mut lines = BTreeSet::from([format!("message {name}")]);
    for field in &message.field {
        let mut parts = vec![
            "field".to_owned(),
            name.clone(),
            field.name().to_owned(),
            field.number().to_string(),
        ];
        if let Some(entry) = maps.get(strip(field.type_name())) {
            let key = &entry.field[0];
            let value = &entry.field[1];
            let word = |f: &prost_types::FieldDescriptorProto| {
                if f.type_name.is_some() {
                    strip(f.type_name()).to_owned()
                } else {
                    type_word(f.r#type()).to_owned()
                }
            };
            parts.push("map".into());
            parts.push(format!("{}:{}", word(key), word(value)));
        } else {
            parts.push(match field.label() {
                Label::Repeated => "repeated".into(),
                Label::Required => "required".into(),
                Label::Optional => "optional".into(),
            });
            parts.push(type_word(field.r#type()).into());
            if field.type_name.is_some() {
                parts.push(strip(field.type_name()).into());
            }
        }
        if let Some(index) = field.oneof_index
            && !field.proto3_optional()
        {
            let oneof = &message.oneof_decl[usize::try_from(index).expect("index")];
            parts.push(format!("oneof={}", oneof.name()));
        }
        if field.proto3_optional() {
            parts.push("optional".into());
        }
        lines.insert(parts.join(" "));
    }
    out.insert(format!("message {name}"), lines);
    for nested in message
        .nested_type
        .iter()
        .filter(|n| !maps.contains_key(&format!("{name}.{}", n.name())))
    {
        add_message(out, &name, nested);
    }
    for enumeration in &message.enum_type {
        add_enum(out, &name, enumeration);
    }
}

/// Talos's descriptors, grouped the same way.
fn talos() -> Entities {
    let binary = ichor_testenv::assets::oracles_dir().join("talos-conformance");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build it",
        binary.display()
    );
    let output = Command::new(&binary)
        .arg("dump")
        .output()
        .expect("run talos-conformance");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut out = Entities::new();
    for line in String::from_utf8(output.stdout).expect("utf8").lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let key = match words[0] {
            "method" => format!("method {} {}", words[1], words[2]),
            "message" | "field" => format!("message {}", words[1]),
            "value" => format!("enum {}", words[1]),
            other => panic!("unexpected dump line kind {other}"),
        };
        out.entry(key).or_default().insert(line.to_owned());
    }
    out
}

#[test]
fn proto_matches_the_descriptors_talos_registers() {
    let ours = ours();
    let talos = talos();
    assert!(
        ours.len() > 80,
        "our descriptors cover the API subset: {}",
        ours.len()
    );
    let mut differences = Vec::new();
    for (entity, lines) in &ours {
        match talos.get(entity) {
            None => differences.push(format!("{entity}: Talos has no such thing")),
            Some(theirs) if theirs != lines => {
                for line in lines.difference(theirs) {
                    differences.push(format!("ours only:  {line}"));
                }
                for line in theirs.difference(lines) {
                    differences.push(format!("Talos only: {line}"));
                }
            }
            Some(_) => {}
        }
    }
    assert!(
        differences.is_empty(),
        "proto/ differs from Talos:\n{}",
        differences.join("\n")
    );
}
