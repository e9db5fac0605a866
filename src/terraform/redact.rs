//! A terraform command line as records and logs show it: the values of `-var`, `-var-file`,
//! `-backend-config` and of secret-looking `KEY=VALUE` arguments replaced.

/// Placeholder for redacted values.
pub const REDACTED: &str = "<redacted>";

/// Options whose value is always redacted (they carry variables and backend credentials).
const SECRET_OPTIONS: [&str; 3] = ["var", "var-file", "backend-config"];

/// Key fragments that make a `KEY=VALUE` argument's value a secret.
const SECRET_KEYS: [&str; 9] = [
    "password",
    "passwd",
    "secret",
    "token",
    "key",
    "credential",
    "auth",
    "private",
    "cert",
];

/// argv with the values of -var, -var-file, -backend-config and secret-looking `KEY=VALUE`
/// arguments replaced by `<redacted>`.
pub fn redact(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut redact_next = false;
    for a in args {
        if redact_next {
            out.push(REDACTED.to_string());
            redact_next = false;
            continue;
        }
        let opt = a.strip_prefix("--").or_else(|| a.strip_prefix('-'));
        if let Some(opt) = opt {
            let (name, value) = match opt.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (opt, None),
            };
            if SECRET_OPTIONS.contains(&name) {
                match value {
                    Some(_) => out.push(format!(
                        "{}={REDACTED}",
                        &a[..a.len() - value.map_or(0, |v| v.len()) - 1]
                    )),
                    None => {
                        out.push(a.clone());
                        redact_next = true;
                    }
                }
                continue;
            }
        }
        out.push(redact_secret_pair(a));
    }
    out
}

fn redact_secret_pair(a: &str) -> String {
    if let Some((k, _)) = a.split_once('=') {
        let lower = k.to_ascii_lowercase();
        if SECRET_KEYS.iter().any(|s| lower.contains(s)) {
            return format!("{k}={REDACTED}");
        }
    }
    a.to_string()
}

#[cfg(test)]
mod tests {
    use super::super::tests::s;
    use super::*;

    #[test]
    fn redaction() {
        let got = redact(&s(&[
            "apply",
            "-var=password=hunter2",
            "-var",
            "token=abc",
            "-var-file=secrets.tfvars",
            "--backend-config=access_key=AKIA",
            "-backend-config",
            "x.hcl",
            "db_password=p",
            "-auto-approve",
            "-target=aws_s3_bucket.key",
        ]));
        assert_eq!(
            got,
            s(&[
                "apply",
                "-var=<redacted>",
                "-var",
                "<redacted>",
                "-var-file=<redacted>",
                "--backend-config=<redacted>",
                "-backend-config",
                "<redacted>",
                "db_password=<redacted>",
                "-auto-approve",
                "-target=aws_s3_bucket.key",
            ])
        );
        assert!(!got.join(" ").contains("hunter2"));
    }
}
