//! Follows terraform's output and keeps the resources whose create, update or destroy started and
//! has not completed: the orphan candidates if the run dies.
//!
//! Both output formats: the human one (`null_resource.a: Creating...` ... `Creation complete after
//! 2s [id=...]`) and `-json` lines (`apply_start` ... `apply_complete` / `apply_errored`). A failed
//! resource prints nothing in the human format (only a diagnostic on stderr), so it stays a
//! candidate: over-reporting a candidate is harmless, missing one is not.
//!
//! It also notices when terraform says its lock may be left behind although it exits by itself
//! (`Error releasing the state lock`, a crash), so the init keeps the record then.

use std::collections::BTreeSet;

/// Longest line kept while waiting for its newline; longer ones are skipped (never a progress line).
const MAX_LINE: usize = 64 << 10;

/// What an operation on a resource became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Started,
    Finished,
}

/// The follower of one run's output (both streams).
#[derive(Debug, Default)]
pub struct Follower {
    partial: [Vec<u8>; 2],
    skipping: [bool; 2],
    in_progress: BTreeSet<String>,
    changed: bool,
    lock_trouble: Option<&'static str>,
}

/// Output that means terraform may exit by itself and still leave its lock, with the reason kept
/// in the record.
const LOCK_TROUBLE: [(&str, &str); 2] = [
    (
        "Error releasing the state lock",
        "terraform reported \"Error releasing the state lock\"",
    ),
    ("TERRAFORM CRASH", "terraform crashed (TERRAFORM CRASH)"),
];

impl Follower {
    /// Feeds output bytes of stream `idx` (0 stdout, 1 stderr).
    pub fn feed(&mut self, idx: usize, bytes: &[u8]) {
        let idx = idx.min(1);
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if self.skipping[idx] {
                self.skipping[idx] = false;
                self.partial[idx].clear();
                continue;
            }
            if self.partial[idx].is_empty() {
                self.line(head);
            } else {
                let mut line = std::mem::take(&mut self.partial[idx]);
                line.extend_from_slice(head);
                self.line(&line);
            }
        }
        if !self.skipping[idx] {
            self.partial[idx].extend_from_slice(rest);
            if self.partial[idx].len() > MAX_LINE {
                self.partial[idx].clear();
                self.skipping[idx] = true;
            }
        }
    }

    /// Resources in progress, sorted.
    pub fn in_progress(&self) -> Vec<String> {
        self.in_progress.iter().cloned().collect()
    }

    /// Why terraform's lock may be left although it exits by itself, if its output said so.
    pub fn lock_trouble(&self) -> Option<&'static str> {
        self.lock_trouble
    }

    /// Whether the set changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::replace(&mut self.changed, false)
    }

    fn line(&mut self, raw: &[u8]) {
        let Ok(text) = std::str::from_utf8(raw) else {
            return;
        };
        let clean = strip_ansi(text);
        let line = clean.trim();
        if self.lock_trouble.is_none() {
            self.lock_trouble = LOCK_TROUBLE
                .iter()
                .find(|(m, _)| line.contains(m))
                .map(|(_, why)| *why);
        }
        let parsed = if line.starts_with('{') {
            parse_json(line)
        } else {
            parse_human(line)
        };
        if let Some((addr, ev)) = parsed {
            let changed = match ev {
                Event::Started => self.in_progress.insert(addr),
                Event::Finished => self.in_progress.remove(&addr),
            };
            self.changed |= changed;
        }
    }
}

/// `s` without ANSI CSI escapes (terraform colours its output unless -no-color).
pub(crate) fn strip_ansi(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains('\u{1b}') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            if chars.next() == Some('[') {
                for c2 in chars.by_ref() {
                    if ('@'..='~').contains(&c2) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    std::borrow::Cow::Owned(out)
}

/// Longest resource address looked for at the start of a line.
const MAX_ADDR: usize = 4096;

/// `addr: Creating...`, `addr: Creation complete after 2s [id=1]`, and the update/destroy forms.
/// An address can itself contain `: ` (a for_each key such as `["kind: ConfigMap"]`), so each
/// `: ` in the first MAX_ADDR bytes is tried as the separator, the first that fits wins.
fn parse_human(line: &str) -> Option<(String, Event)> {
    line.match_indices(": ")
        .take_while(|(i, _)| *i <= MAX_ADDR)
        .find_map(|(i, _)| parse_human_at(&line[..i], &line[i + 2..]))
}

fn parse_human_at(addr: &str, rest: &str) -> Option<(String, Event)> {
    // The message first: it is the cheap check, and it rules out most separators.
    let ev = if rest.starts_with("Creating...")
        || rest.starts_with("Modifying...")
        || rest.starts_with("Destroying...")
    {
        Event::Started
    } else if rest.starts_with("Creation complete")
        || rest.starts_with("Modifications complete")
        || rest.starts_with("Destruction complete")
    {
        Event::Finished
    } else {
        return None;
    };
    // `null_resource.a (deposed object 5e1d6a0c)`: a deposed object during a replacement.
    let base = match addr.split_once(" (deposed object ") {
        Some((b, key)) if key.ends_with(')') && !key.contains(' ') => b,
        _ => addr,
    };
    if base.is_empty() || base.contains(' ') && !base.contains('"') || !looks_like_address(base) {
        return None;
    }
    Some((addr.to_string(), ev))
}

/// A resource address: `type.name`, with optional `module.x.` prefixes, `data.`, and `[index]`s.
fn looks_like_address(addr: &str) -> bool {
    let first = addr.chars().next().unwrap_or(' ');
    (first.is_ascii_alphabetic() || first == '_') && addr.contains('.')
}

fn parse_json(line: &str) -> Option<(String, Event)> {
    #[derive(serde::Deserialize)]
    struct Msg {
        #[serde(rename = "type")]
        kind: String,
        hook: Option<Hook>,
    }
    #[derive(serde::Deserialize)]
    struct Hook {
        resource: Option<Res>,
        action: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Res {
        addr: String,
    }
    let msg: Msg = serde_json::from_str(line).ok()?;
    let hook = msg.hook?;
    let addr = hook.resource?.addr;
    let ev = match msg.kind.as_str() {
        "apply_start" => match hook.action.as_deref() {
            Some("create" | "update" | "delete" | "replace") => Event::Started,
            _ => return None,
        },
        "apply_complete" | "apply_errored" => Event::Finished,
        _ => return None,
    };
    Some((addr, ev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_format() {
        let mut f = Follower::default();
        f.feed(
            0,
            b"null_resource.a: Creating...\nnull_resource.b[0]: Creating...\n",
        );
        f.feed(0, b"module.m.null_resource.c[\"x\"]: Destroying... [id=1]\nnull_resource.a: Still creating... [10s elapsed]\n");
        assert_eq!(
            f.in_progress(),
            vec![
                "module.m.null_resource.c[\"x\"]",
                "null_resource.a",
                "null_resource.b[0]"
            ]
        );
        assert!(f.take_changed());
        assert!(!f.take_changed());
        f.feed(0, b"null_resource.a: Creation complete after 2s [id=123]\nmodule.m.null_resource.c[\"x\"]: Destruction complete after 0s\n");
        assert_eq!(f.in_progress(), vec!["null_resource.b[0]"]);
    }

    #[test]
    fn addresses_whose_key_contains_a_colon_and_space() {
        let mut f = Follower::default();
        f.feed(
            0,
            b"kubernetes_manifest.cm[\"kind: ConfigMap\"]: Creating...\n",
        );
        assert_eq!(
            f.in_progress(),
            vec!["kubernetes_manifest.cm[\"kind: ConfigMap\"]"]
        );
        f.feed(
            0,
            b"kubernetes_manifest.cm[\"kind: ConfigMap\"]: Creation complete after 1s\n",
        );
        assert!(f.in_progress().is_empty());
    }

    #[test]
    fn split_lines_and_colors() {
        let mut f = Follower::default();
        f.feed(0, b"\x1b[0m\x1b[1mnull_resource.a: Crea");
        assert!(f.in_progress().is_empty());
        f.feed(0, b"ting...\x1b[0m\n");
        assert_eq!(f.in_progress(), vec!["null_resource.a"]);
    }

    #[test]
    fn json_format() {
        let mut f = Follower::default();
        f.feed(0, br#"{"@level":"info","@message":"null_resource.a: Creating...","type":"apply_start","hook":{"resource":{"addr":"null_resource.a","resource_type":"null_resource"},"action":"create"}}
"#);
        f.feed(0, br#"{"@level":"info","type":"apply_start","hook":{"resource":{"addr":"null_resource.b"},"action":"read"}}
"#);
        assert_eq!(f.in_progress(), vec!["null_resource.a"]);
        f.feed(0, br#"{"type":"apply_complete","hook":{"resource":{"addr":"null_resource.a"},"action":"create"}}
"#);
        assert!(f.in_progress().is_empty());
    }

    /// Real terraform 1.0.3 output (tests/fixtures/terraform, docs/notes/terraform-facts.md 5).
    const HUMAN: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/terraform/apply-human.txt"
    ));
    const JSON: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/terraform/apply-json.txt"
    ));

    /// The fixture's sections (`### [name] ...` markers), by name.
    fn section<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let marker = format!("### [{name}]");
        let mut out = Vec::new();
        let mut on = false;
        for l in text.lines() {
            if l.starts_with("### ") {
                on = l.starts_with(&marker);
                continue;
            }
            if on {
                out.push(l);
            }
        }
        out
    }

    #[test]
    fn real_human_apply_ends_with_nothing_in_progress() {
        for name in ["create", "replace", "destroy"] {
            let lines = section(HUMAN, name);
            assert!(!lines.is_empty(), "{name}");
            let mut f = Follower::default();
            let mut peak = 0;
            for l in &lines {
                f.feed(0, format!("{l}\n").as_bytes());
                peak = peak.max(f.in_progress().len());
            }
            assert!(peak >= 5, "{name}: peak {peak}");
            assert!(f.in_progress().is_empty(), "{name}: {:?}", f.in_progress());
            assert!(f.lock_trouble().is_none());
        }
    }

    #[test]
    fn real_human_apply_cut_mid_creation_has_the_unfinished_resources() {
        let lines = section(HUMAN, "create");
        let cut = lines
            .iter()
            .position(|l| l.starts_with("module.m.null_resource.d: Creation complete"))
            .unwrap();
        let mut f = Follower::default();
        for l in &lines[..=cut] {
            f.feed(0, format!("{l}\n").as_bytes());
        }
        assert_eq!(
            f.in_progress(),
            vec![
                "null_resource.a",
                "null_resource.b[0]",
                "null_resource.b[1]",
                "null_resource.c[\"x\"]",
                "null_resource.c[\"y\"]",
            ]
        );
    }

    #[test]
    fn real_human_interrupted_apply_keeps_the_failed_resources() {
        // A failed resource prints no "errored" line in the human format.
        let mut f = Follower::default();
        for l in section(HUMAN, "sigterm-once") {
            f.feed(0, format!("{l}\n").as_bytes());
        }
        assert!(!f.in_progress().is_empty());
    }

    #[test]
    fn real_json_apply_runs_end_with_nothing_in_progress() {
        let mut f = Follower::default();
        let mut starts = 0;
        for l in JSON.lines().filter(|l| !l.starts_with("### ")) {
            f.feed(0, format!("{l}\n").as_bytes());
            starts = starts.max(f.in_progress().len());
        }
        assert!(starts >= 5, "peak {starts}");
        // Every apply_start of the recording has its apply_complete or apply_errored.
        assert!(f.in_progress().is_empty(), "{:?}", f.in_progress());
    }

    #[test]
    fn deposed_objects_are_tracked_by_their_full_name() {
        let mut f = Follower::default();
        f.feed(
            0,
            b"null_resource.a (deposed object 5e1d6a0c): Destroying... [id=1]\n",
        );
        assert_eq!(
            f.in_progress(),
            vec!["null_resource.a (deposed object 5e1d6a0c)"]
        );
        f.feed(
            0,
            b"null_resource.a (deposed object 5e1d6a0c): Destruction complete after 0s\n",
        );
        assert!(f.in_progress().is_empty());
        f.feed(
            0,
            b"null_resource.a (local-exec): null_resource.z: Creating...\n",
        );
        assert!(
            f.in_progress().is_empty(),
            "provisioner output is not terraform's"
        );
    }

    #[test]
    fn lock_release_errors_and_crashes_are_noticed() {
        let mut f = Follower::default();
        f.feed(
            1,
            b"\n\x1b[31mError: \x1b[0mError releasing the state lock\n",
        );
        assert!(f.lock_trouble().unwrap().contains("releasing"));
        let mut f = Follower::default();
        f.feed(0, br#"{"@level":"error","@message":"Error: Error releasing the state lock","type":"diagnostic"}
"#);
        assert!(f.lock_trouble().is_some());
        let mut f = Follower::default();
        f.feed(
            1,
            b"!!!!!!!!!!!!!!!!!!!!!!!!!!! TERRAFORM CRASH !!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
        );
        assert!(f.lock_trouble().unwrap().contains("crash"));
        let mut f = Follower::default();
        f.feed(1, b"Error: Error acquiring the state lock\n");
        assert!(f.lock_trouble().is_none());
    }

    #[test]
    fn ignores_other_lines_and_huge_lines() {
        let mut f = Follower::default();
        f.feed(1, b"Error: something: Creating... went wrong\n");
        f.feed(0, &vec![b'x'; MAX_LINE + 10]);
        f.feed(0, b"tail: Creating...\nnull_resource.z: Creating...\n");
        assert_eq!(f.in_progress(), vec!["null_resource.z"]);
    }
}
