//! Where the real terraform (or tofu) binary is: TFINIT_TERRAFORM, else the next one on PATH
//! that is not tfinit itself.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why the real terraform binary cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// TFINIT_TERRAFORM points at something unusable.
    #[error("TFINIT_TERRAFORM={path:?} {problem}: set it to the real terraform binary, e.g. TFINIT_TERRAFORM=/usr/local/bin/terraform.real")]
    BadOverride {
        /// The value.
        path: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// Nothing on PATH but ourselves.
    #[error("no real {name} on PATH={path:?} besides tfinit's own shim: install {name} later on PATH than the shim, or set TFINIT_TERRAFORM to its path")]
    NotOnPath {
        /// terraform or tofu.
        name: String,
        /// PATH as searched.
        path: String,
    },
}

/// Finds the real binary for `name` (terraform or tofu): TFINIT_TERRAFORM wins, else the first
/// `name` on PATH that is not this very executable (compared by resolved path).
pub fn find_real(
    name: &str,
    override_path: Option<&OsStr>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, FindError> {
    let me = std::fs::canonicalize("/proc/self/exe").ok();
    if let Some(p) = override_path.filter(|p| !p.is_empty()) {
        let pb = PathBuf::from(p);
        let shown = pb.to_string_lossy().to_string();
        if !is_executable(&pb) {
            return Err(FindError::BadOverride {
                path: shown,
                problem: "is not an executable file",
            });
        }
        if me.is_some() && std::fs::canonicalize(&pb).ok() == me {
            return Err(FindError::BadOverride {
                path: shown,
                problem: "is tfinit itself (the shim)",
            });
        }
        return Ok(pb);
    }
    let path_text = path_var
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_default();
    for dir in std::env::split_paths(path_var.unwrap_or_default()) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(name);
        if !is_executable(&candidate) {
            continue;
        }
        if me.is_some() && std::fs::canonicalize(&candidate).ok() == me {
            continue;
        }
        return Ok(candidate);
    }
    Err(FindError::NotOnPath {
        name: name.to_string(),
        path: path_text,
    })
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
