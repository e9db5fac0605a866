//! The `Who` terraform writes in a state lock's info: `user@hostname`, with the user as Go's
//! pure-Go os/user finds it (terraform binaries are built without cgo). A recovery compares it
//! with the record's to tell a dead run's lock from anyone else's.

use crate::protocol::env_value;

/// The passwd entry's user name of our uid, as Go's pure-Go os/user finds it. Reads /etc/passwd:
/// never on the PID-1 loop (the recorder reads it once when it opens the store).
pub fn passwd_user() -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd_name(&passwd, nix::unistd::getuid().as_raw())
}

/// The host part of a lock's Who (`user@host`).
pub fn who_host(who: &str) -> &str {
    who.rsplit_once('@').map_or(who, |(_, host)| host)
}

/// The lock's `Who` for a run with environment `env`, given our uid's passwd user name (see
/// [`passwd_user`]) and the hostname: `user@host`, the user being the passwd name, else $USER
/// when $USER and $HOME are both set, else empty. No I/O.
pub fn who_for(passwd_user: Option<&str>, host: &str, env: &[String]) -> String {
    let user = passwd_user.map(str::to_string).unwrap_or_else(|| {
        match (env_value(env, "USER"), env_value(env, "HOME")) {
            (Some(u), Some(_)) => u.to_string(),
            _ => String::new(),
        }
    });
    format!("{user}@{host}")
}

/// The user name of `uid` in passwd text, exactly as Go's pure-Go lookup (os/user,
/// lookup_unix.go) reads it: lines trimmed, `#` comments skipped, at least 6 colons, the uid field
/// equal to the decimal uid as a string, a name not starting with `+` or `-`, numeric uid and gid.
fn passwd_name(text: &str, uid: u32) -> Option<String> {
    let want = uid.to_string();
    let numeric = |s: &str| {
        let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    };
    text.lines().find_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.matches(':').count() < 6 {
            return None;
        }
        let parts: Vec<&str> = line.splitn(7, ':').collect();
        let name = parts[0];
        let ok = parts.len() >= 6
            && parts[2] == want
            && !name.is_empty()
            && !name.starts_with(['+', '-'])
            && numeric(parts[2])
            && numeric(parts[3]);
        ok.then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lookup_matches_go() {
        let text =
            "# comment\nroot:x:0:0:root:/root:/bin/bash\n  app:x:1000:1000::/home/app:/bin/sh\n\
                    +nis:x:2000:2000::/:/bin/sh\nshort:x:3000:3000\nzero:x:0042:1::/:/bin/sh\n\
                    badgid:x:5000:g::/:/bin/sh\n";
        assert_eq!(passwd_name(text, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(text, 1000).as_deref(), Some("app"));
        assert_eq!(passwd_name(text, 2000), None, "+ entries are NIS markers");
        assert_eq!(passwd_name(text, 3000), None, "fewer than 6 colons");
        assert_eq!(passwd_name(text, 42), None, "uid compared as a string");
        assert_eq!(passwd_name(text, 5000), None, "gid must be numeric");
        assert_eq!(passwd_name(text, 4321), None);
    }

    #[test]
    fn without_a_passwd_entry_the_user_is_user_when_user_and_home_are_set() {
        let env = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            who_for(Some("app"), "pod-a", &env(&["USER=x"])),
            "app@pod-a"
        );
        assert_eq!(
            who_for(None, "pod-a", &env(&["USER=x", "HOME=/h"])),
            "x@pod-a"
        );
        assert_eq!(who_for(None, "pod-a", &env(&["USER=x"])), "@pod-a");
        assert_eq!(
            who_for(None, "pod-a", &env(&["USER=", "HOME=/h"])),
            "@pod-a"
        );
    }
}
