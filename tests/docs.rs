//! The documentation stays in step with the code: docs/troubleshooting.md has an entry for every
//! message tfinit prints at warn or error level or to stderr, and docs/timeline.svg is what
//! scripts/gen-timeline-svg.py draws.
//!
//! Messages are found in src/ by reading the source: the format string of each `warn!`, `error!`
//! and `eprintln!` call, each thiserror `#[error("...")]` template, and each string literal that
//! starts with `tfinit: ` (texts built with `format!` that reach a user). The entry must quote the
//! message: its literal parts between `{placeholders}`, in order, close together (a placeholder may
//! be shown as `<path>`, `…` or an example value); whitespace and line breaks do not matter.
//! Messages with fewer than two words of their own (`"{e}"`, `"tfinit: {e}"`) only pass on another
//! message, which is checked itself. List them all with
//! `TFINIT_LIST_MESSAGES=1 cargo test --test docs -- --nocapture`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{repo, require};

/// One user-visible message in the source.
#[derive(Debug, Clone)]
struct Message {
    /// `src/...rs:LINE`.
    at: String,
    /// `warn!`, `error!`, `eprintln!`, `#[error]` or `"tfinit: ..."`.
    kind: &'static str,
    /// The format string, unescaped, placeholders kept.
    text: String,
}

/// How far apart two literal parts of a message may be in the entry (room for a placeholder's
/// example value such as `<path>` or `"/var/lib/tfinit"`).
const GAP: usize = 120;

impl Message {
    /// The literal parts between placeholders, whitespace collapsed, tfinit's prefixes dropped.
    fn parts(&self) -> Vec<String> {
        let mut parts: Vec<String> = literal_segments(&self.text)
            .iter()
            .map(|s| collapse(s).trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(first) = parts.first_mut() {
            for prefix in ["tfinit:", "warning:"] {
                *first = first
                    .strip_prefix(prefix)
                    .unwrap_or(first)
                    .trim()
                    .to_string();
            }
        }
        parts.retain(|s| !s.is_empty());
        parts
    }

    /// Whether the message says something of its own: two words or more outside placeholders
    /// (`"{e}"` and `"tfinit: {e}"` only pass on another message, which is checked itself).
    fn checked(&self) -> bool {
        let words: usize = self
            .parts()
            .iter()
            .map(|p| {
                p.split_whitespace()
                    .filter(|w| w.chars().any(char::is_alphabetic))
                    .count()
            })
            .sum();
        words >= 2
    }

    /// Whether `doc` quotes the message: its literal parts in order, each at most GAP bytes after
    /// the previous one (placeholders may be written as anything short).
    fn found_in(&self, doc: &str) -> bool {
        fn rest_found(doc: &str, from: usize, parts: &[String]) -> bool {
            let Some((first, rest)) = parts.split_first() else {
                return true;
            };
            let window_end = (from + GAP + first.len()).min(doc.len());
            let mut start = from;
            while let Some(i) = doc
                .get(start..window_end)
                .and_then(|w| w.find(first.as_str()))
            {
                let at = start + i;
                if rest_found(doc, at + first.len(), rest) {
                    return true;
                }
                start = at + 1;
                while !doc.is_char_boundary(start) {
                    start += 1;
                }
            }
            false
        }
        let parts = self.parts();
        let Some((first, rest)) = parts.split_first() else {
            return true;
        };
        doc.match_indices(first.as_str())
            .any(|(at, _)| rest_found(doc, at + first.len(), rest))
    }

    /// The message as an entry would quote it, placeholders shown as `…`.
    fn template(&self) -> String {
        self.parts().join(" … ")
    }
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The literal parts of a format string: `{{`/`}}` become braces, `{...}` placeholders split.
fn literal_segments(fmt: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut it = fmt.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '{' if it.peek() == Some(&'{') => {
                it.next();
                out.last_mut().unwrap().push('{');
            }
            '}' if it.peek() == Some(&'}') => {
                it.next();
                out.last_mut().unwrap().push('}');
            }
            '{' => {
                for c2 in it.by_ref() {
                    if c2 == '}' {
                        break;
                    }
                }
                out.push(String::new());
            }
            _ => out.last_mut().unwrap().push(c),
        }
    }
    out
}

/// Every .rs file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A tokenizer just good enough for macro arguments: skips comments, reads string literals
/// (plain and raw), and tracks bracket depth.
struct Scanner<'a> {
    src: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    /// Reads a string literal starting at `pos` (at `"`, `r"` or `r#"`); returns its value.
    fn string(&mut self) -> Option<String> {
        let s = self.src;
        let mut p = self.pos;
        if s.get(p) == Some(&b'r') {
            p += 1;
            let mut hashes = 0;
            while s.get(p) == Some(&b'#') {
                hashes += 1;
                p += 1;
            }
            if s.get(p) != Some(&b'"') {
                return None;
            }
            p += 1;
            let start = p;
            loop {
                if p >= s.len() {
                    return None;
                }
                if s[p] == b'"'
                    && s[p + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&b| b == b'#')
                        .count()
                        == hashes
                {
                    let v = String::from_utf8_lossy(&s[start..p]).into_owned();
                    self.pos = p + 1 + hashes;
                    return Some(v);
                }
                p += 1;
            }
        }
        if s.get(p) != Some(&b'"') {
            return None;
        }
        p += 1;
        let mut v = Vec::new();
        while p < s.len() {
            match s[p] {
                b'"' => {
                    self.pos = p + 1;
                    return Some(String::from_utf8_lossy(&v).into_owned());
                }
                b'\\' => {
                    p += 1;
                    match s.get(p) {
                        // Line continuation: the newline and the next line's indentation vanish.
                        Some(b'\n') => {
                            p += 1;
                            while s.get(p).is_some_and(|b| b.is_ascii_whitespace()) {
                                p += 1;
                            }
                            continue;
                        }
                        Some(b'n') | Some(b't') => v.push(b' '),
                        Some(&c) => v.push(c),
                        None => return None,
                    }
                    p += 1;
                }
                c => {
                    v.push(c);
                    p += 1;
                }
            }
        }
        None
    }

    /// From just after an opening `(`, the top-level arguments up to the matching `)`, each as
    /// (its first string literal if the argument starts with one, its raw text).
    fn args(&mut self) -> Vec<(Option<String>, String)> {
        let mut args = Vec::new();
        let mut depth = 0usize;
        let mut start = self.pos;
        let mut first_literal: Option<String> = None;
        let mut arg_has_token = false;
        while self.pos < self.src.len() {
            let c = self.src[self.pos];
            if c == b'"'
                || (c == b'r'
                    && matches!(self.src.get(self.pos + 1), Some(b'"') | Some(b'#'))
                    && !self.src[self.pos.saturating_sub(1)].is_ascii_alphanumeric())
            {
                let at_start = !arg_has_token;
                if let Some(v) = self.string() {
                    if at_start && depth == 0 {
                        first_literal = Some(v);
                    }
                    arg_has_token = true;
                    continue;
                }
            }
            if c == b'/' && self.src.get(self.pos + 1) == Some(&b'/') {
                while self.pos < self.src.len() && self.src[self.pos] != b'\n' {
                    self.pos += 1;
                }
                continue;
            }
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' if depth == 0 => {
                    let raw = String::from_utf8_lossy(&self.src[start..self.pos])
                        .trim()
                        .to_string();
                    if !raw.is_empty() {
                        args.push((first_literal.take(), raw));
                    }
                    self.pos += 1;
                    return args;
                }
                b')' | b']' | b'}' => depth -= 1,
                b',' if depth == 0 => {
                    let raw = String::from_utf8_lossy(&self.src[start..self.pos])
                        .trim()
                        .to_string();
                    args.push((first_literal.take(), raw));
                    start = self.pos + 1;
                    arg_has_token = false;
                    self.pos += 1;
                    continue;
                }
                _ => {}
            }
            if !c.is_ascii_whitespace() {
                arg_has_token = true;
            }
            self.pos += 1;
        }
        args
    }
}

/// The message of the macro call or attribute at `at` whose arguments start at `args_from`: its
/// first argument that is a string literal (tracing's fields come before it). None in comments.
fn message_at(
    text: &str,
    at: usize,
    args_from: usize,
    rel: &str,
    kind: &'static str,
) -> Option<Message> {
    let line_start = text[..at].rfind('\n').map_or(0, |p| p + 1);
    if text[line_start..at].trim_start().starts_with("//") {
        return None;
    }
    let mut sc = Scanner {
        src: text.as_bytes(),
        pos: args_from,
    };
    let fmt = sc.args().into_iter().find_map(|(lit, _)| lit)?;
    Some(Message {
        at: format!("{rel}:{}", text[..at].matches('\n').count() + 1),
        kind,
        text: fmt,
    })
}

/// Every user-visible message in src/.
fn messages() -> Vec<Message> {
    let root = repo();
    let mut out = Vec::new();
    for file in rust_files(&root.join("src")) {
        let text = std::fs::read_to_string(&file).expect("read source");
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let bytes = text.as_bytes();
        let line_of = |pos: usize| text[..pos].matches('\n').count() + 1;
        // Macro calls and #[error(...)].
        // Calls of warn!, error!, eprintln! and of local wrappers named like them (warn_record!),
        // and #[error(...)] attributes.
        let mut from = 0;
        while let Some(i) = text[from..].find("!(") {
            let at = from + i;
            from = at + 2;
            let ident_start = text[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |p| p + 1);
            let ident = &text[ident_start..at];
            let kind = match ident {
                "eprintln" => "eprintln!",
                _ if ident.split('_').any(|w| w == "warn") => "warn!",
                _ if ident.split('_').any(|w| w == "error") => "error!",
                _ => continue,
            };
            if let Some(m) = message_at(&text, ident_start, from, &rel, kind) {
                out.push(m);
            }
        }
        let mut from = 0;
        while let Some(i) = text[from..].find("#[error(") {
            let at = from + i;
            from = at + "#[error(".len();
            if let Some(m) = message_at(&text, at, from, &rel, "#[error]") {
                out.push(m);
            }
        }
        // The texts of log notices built in one place and logged as "{m}" (locks::book's
        // Notice::message): each `format!` in a `fn message(&self) -> String`.
        if let Some(start) = text.find("fn message(&self) -> String") {
            let end = text[start..]
                .find("\n    }\n")
                .map_or(text.len(), |e| start + e);
            let mut from = start;
            while let Some(i) = text[from..end].find("format!(") {
                let at = from + i;
                from = at + "format!(".len();
                if let Some(m) = message_at(&text, at, from, &rel, "notice") {
                    out.push(m);
                }
            }
        }
        // Literals that start with "tfinit: " wherever they are (format! texts shown to users).
        let mut from = 0;
        while let Some(i) = text[from..].find("\"tfinit: ") {
            let at = from + i;
            let mut sc = Scanner {
                src: bytes,
                pos: at,
            };
            match sc.string() {
                Some(v) => {
                    from = sc.pos;
                    // Already found as a macro's format string in this file?
                    let prefix = format!("{rel}:");
                    if out.iter().any(|m| m.text == v && m.at.starts_with(&prefix)) {
                        continue;
                    }
                    out.push(Message {
                        at: format!("{rel}:{}", line_of(at)),
                        kind: "\"tfinit: ...\"",
                        text: v,
                    });
                }
                None => from = at + 1,
            }
        }
    }
    out
}

fn troubleshooting() -> String {
    collapse(
        &std::fs::read_to_string(repo().join("docs/troubleshooting.md"))
            .expect("docs/troubleshooting.md"),
    )
}

#[test]
fn the_message_scanner_finds_known_messages_and_what_an_entry_must_quote() {
    let all = messages();
    // A handful that must be found, each of a different kind (a scanner that finds nothing would
    // make the next test pass vacuously).
    for (kind, phrase) in [
        (
            "notice",
            "the lock-owner record store is not usable: tfinit keeps working without lock-owner records",
        ),
        (
            "warn!",
            "terraform ended without releasing its state lock for sure",
        ),
        (
            "eprintln!",
            "no command to run: use `tfinit [OPTIONS] -- COMMAND [ARGS...]`",
        ),
        ("#[error]", "besides tfinit's own shim: install"),
        ("\"tfinit: ...\"", "terraform was not started"),
    ] {
        assert!(
            all.iter()
                .any(|m| m.kind == kind && m.checked() && m.text.contains(phrase)),
            "the scanner missed the {kind} message with {phrase:?}; found {} messages",
            all.len()
        );
    }
    assert!(all.len() >= 40, "only {} messages found in src/", all.len());
    // Placeholders split the text; prefixes are dropped; the parts must come in order, close.
    let m = Message {
        at: "x".into(),
        kind: "eprintln!",
        text: "tfinit: warning: {why}; running {} directly, without protection".into(),
    };
    assert_eq!(m.parts(), ["; running", "directly, without protection"]);
    assert!(m.found_in("`<why>; running /usr/bin/terraform directly, without protection`"));
    assert!(
        !m.found_in("directly, without protection; running x"),
        "order matters"
    );
    let far = format!(
        "; running {} directly, without protection",
        "x".repeat(GAP + 1)
    );
    assert!(!m.found_in(&far), "parts far apart are not one quote");
    let pass_through = Message {
        at: "x".into(),
        kind: "eprintln!",
        text: "tfinit: {e}".into(),
    };
    assert!(!pass_through.checked());
}

#[test]
fn every_warning_and_error_message_has_an_entry_in_troubleshooting_md() {
    let doc = troubleshooting();
    let all = messages();
    let list = std::env::var_os("TFINIT_LIST_MESSAGES").is_some();
    let mut missing = Vec::new();
    for m in &all {
        if list {
            println!(
                "{:<32} {:<16} checked={:<5} {:?}",
                m.at,
                m.kind,
                m.checked(),
                m.text
            );
        }
        if m.checked() && !m.found_in(&doc) {
            missing.push(format!("  {} {}: {}", m.at, m.kind, m.template()));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md lacks {} message(s); quote each (any placeholder value in place of …), \
         say what it means and what to do:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn the_timeline_picture_is_what_its_script_draws() {
    let python = ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !require(
        python.is_some(),
        "python3 (to run scripts/gen-timeline-svg.py)",
    ) {
        return;
    }
    let out = Command::new(python.unwrap())
        .arg(repo().join("scripts/gen-timeline-svg.py"))
        .arg("--check")
        .output()
        .expect("run the generator");
    assert!(
        out.status.success(),
        "docs/timeline.svg is stale: run scripts/gen-timeline-svg.py\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(repo().join("docs/timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let how =
        std::fs::read_to_string(repo().join("docs/how-it-works.md")).expect("docs/how-it-works.md");
    assert!(
        how.contains("](timeline.svg)"),
        "docs/how-it-works.md shows the picture"
    );
}
