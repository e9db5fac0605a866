//! Follows terraform's output and keeps the resources whose create, update or destroy started and
//! has not completed: the orphan candidates if the run dies.
//!
//! Both output formats: the human one (`null_resource.a: Creating...` ... `Creation complete after
//! 2s [id=...]`) and `-json` lines (`apply_start` ... `apply_complete` / `apply_errored`).

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
}

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

fn strip_ansi(s: &str) -> std::borrow::Cow<'_, str> {
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

/// `addr: Creating...`, `addr: Creation complete after 2s [id=1]`, and the update/destroy forms.
fn parse_human(line: &str) -> Option<(String, Event)> {
    let (addr, rest) = line.split_once(": ")?;
    if addr.is_empty() || addr.contains(' ') && !addr.contains('"') || !looks_like_address(addr) {
        return None;
    }
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

    #[test]
    fn ignores_other_lines_and_huge_lines() {
        let mut f = Follower::default();
        f.feed(1, b"Error: something: Creating... went wrong\n");
        f.feed(0, &vec![b'x'; MAX_LINE + 10]);
        f.feed(0, b"tail: Creating...\nnull_resource.z: Creating...\n");
        assert_eq!(f.in_progress(), vec!["null_resource.z"]);
    }
}
