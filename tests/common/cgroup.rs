//! A memory cgroup of the test's own with a limit, to run a process under a container's memory
//! limit: cgroup v2 where its memory controller can be given to a new group (as root, on a host
//! or a privileged container), otherwise the v1 memory hierarchy. [`MemoryCgroup::new`] says why
//! not when neither can be made, for the test's one-line skip.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Which cgroup hierarchy the group is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A cgroup made for a test with a memory limit, removed on drop (its processes moved back to
/// its parent first).
pub struct MemoryCgroup {
    dir: PathBuf,
    version: Version,
}

/// Where a cgroup2 hierarchy is mounted whose root offers the memory controller.
fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| {
            std::fs::read_to_string(p.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        })
}

impl MemoryCgroup {
    /// A new group `name` whose processes may use `limit` bytes of memory together (no swap),
    /// or why none can be made here.
    pub fn new(name: &str, limit: u64) -> Result<MemoryCgroup, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("making a memory cgroup needs root".into());
        }
        let name = format!("{name}-{}", std::process::id());
        if let Some(root) = v2_root() {
            // The root's subtree may lack the memory controller; a root has no processes of its
            // own to forbid enabling it.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            let dir = root.join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                let g = MemoryCgroup {
                    dir,
                    version: Version::V2,
                };
                if g.write("memory.max", &limit.to_string()).is_ok() {
                    let _ = g.write("memory.swap.max", "0");
                    return Ok(g);
                }
            }
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        if !v1.join("memory.limit_in_bytes").exists() {
            return Err(
                "no cgroup v2 hierarchy offers the memory controller and no v1 memory hierarchy is mounted"
                    .into(),
            );
        }
        let dir = v1.join(&name);
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot make the memory cgroup {}: {e}", dir.display()))?;
        let g = MemoryCgroup {
            dir,
            version: Version::V1,
        };
        g.write("memory.limit_in_bytes", &limit.to_string())
            .map_err(|e| format!("cannot set its memory limit: {e}"))?;
        // Without swap as well, where the kernel accounts it.
        let _ = g.write("memory.memsw.limit_in_bytes", &limit.to_string());
        let _ = g.write("memory.swappiness", "0");
        Ok(g)
    }

    fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }

    /// Moves process `pid`, all its threads, into the group.
    pub fn add(&self, pid: i32) {
        self.write("cgroup.procs", &pid.to_string())
            .unwrap_or_else(|e| panic!("move pid {pid} into {}: {e}", self.dir.display()));
    }

    /// How many processes of the group the kernel's OOM killer killed.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match self.version {
            Version::V2 => ("memory.events", "oom_kill"),
            Version::V1 => ("memory.oom_control", "oom_kill"),
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The group's directory, for messages.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let parent = self.dir.parent().map(|p| p.join("cgroup.procs"));
        if let (Ok(procs), Some(parent)) = (
            std::fs::read_to_string(self.dir.join("cgroup.procs")),
            parent,
        ) {
            for pid in procs.lines() {
                let _ = std::fs::write(&parent, pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
