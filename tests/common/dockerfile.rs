//! The repository's Dockerfile, read as stages of instructions, for tests/examples.rs.

use super::repo;

/// The repository's Dockerfile as stages of instructions (continuation lines joined, comments dropped).
pub struct Dockerfile {
    /// Instructions before the first FROM.
    pub globals: Vec<String>,
    /// (name, FROM argument, instructions), in order.
    pub stages: Vec<(String, String, Vec<String>)>,
}

impl Dockerfile {
    pub fn stage(&self, name: &str) -> &[String] {
        &self
            .stages
            .iter()
            .find(|s| s.0 == name)
            .unwrap_or_else(|| panic!("the Dockerfile has no stage {name}"))
            .2
    }
}

/// Reads the Dockerfile.
pub fn dockerfile() -> Dockerfile {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        let t = l.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head.trim());
            cur.push(' ');
        } else {
            cur.push_str(t);
            lines.push(cur.split_whitespace().collect::<Vec<_>>().join(" "));
            cur.clear();
        }
    }
    let mut df = Dockerfile {
        globals: Vec::new(),
        stages: Vec::new(),
    };
    for l in lines {
        if let Some(from) = l.strip_prefix("FROM ") {
            let (base, name) = match from.split_once(" AS ") {
                Some((b, n)) => (b.to_string(), n.to_string()),
                None => (from.to_string(), String::new()),
            };
            df.stages.push((name, base, Vec::new()));
        } else if let Some(s) = df.stages.last_mut() {
            s.2.push(l);
        } else {
            df.globals.push(l);
        }
    }
    df
}
