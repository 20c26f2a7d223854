//! A tree printed with box-drawing branches, as `clusterctl describe cluster` prints one.

/// One node of a tree: its line and its children.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree {
    /// The node's line.
    pub label: String,
    /// Its children, in order.
    pub children: Vec<Tree>,
}

impl Tree {
    /// A node without children.
    pub fn leaf(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            children: Vec::new(),
        }
    }

    /// A node with children.
    pub fn node(label: impl Into<String>, children: Vec<Tree>) -> Self {
        Self {
            label: label.into(),
            children,
        }
    }

    /// The tree as text, one line per node, each ended by a newline.
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.label);
        render_children(&self.children, "", &mut out);
        out
    }
}

fn render_children(children: &[Tree], prefix: &str, out: &mut String) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, carry) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        out.push_str(prefix);
        out.push_str(branch);
        out.push_str(&child.label);
        out.push('\n');
        render_children(&child.children, &format!("{prefix}{carry}"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_continue_only_where_siblings_follow() {
        let tree = Tree::node(
            "TalosCluster/lab",
            vec![
                Tree::node(
                    "Control planes",
                    vec![
                        Tree::node("cp-1", vec![Tree::leaf("ConfigApplied=False")]),
                        Tree::leaf("cp-2"),
                    ],
                ),
                Tree::node("Workers", vec![Tree::leaf("worker-1")]),
            ],
        );
        let expected = [
            "TalosCluster/lab",
            "├─ Control planes",
            "│  ├─ cp-1",
            "│  │  └─ ConfigApplied=False",
            "│  └─ cp-2",
            "└─ Workers",
            "   └─ worker-1",
        ];
        assert_eq!(tree.render(), expected.join("\n") + "\n");
    }

    #[test]
    fn a_lone_root_is_one_line() {
        assert_eq!(Tree::leaf("x").render(), "x\n");
    }
}
