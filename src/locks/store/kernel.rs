//! What the kernel proves of an incarnation: its lock file's flock, tested only when the file at
//! the path is the one it locked and it runs on this boot.

use crate::locks::record::{FileId, Heartbeat, Owner};
use crate::mutation::{self, Guard};

/// [`Store::kernel_proof`](super::Store::kernel_proof)'s rule, given `gone`, the store's [`Store::incarnation_gone`](super::Store::incarnation_gone) for
/// `owner` (the simulation calls it with its model of the kernel).
pub fn kernel_proof_with(
    me: &Owner,
    owner: &Owner,
    hb: Option<&Heartbeat>,
    gone: impl FnOnce(FileId) -> Option<bool>,
) -> Option<bool> {
    let hb = hb.filter(|h| h.holds_lock && h.owner.same_incarnation(owner))?;
    let file = match hb.lock_file {
        Some(file) => file,
        // Without the inode check (mutation builds only), whatever file is at the path will do.
        None if !mutation::on(Guard::LockFileInode) => FileId { dev: 0, ino: 0 },
        None => return None,
    };
    if owner.boot_id.is_empty() || owner.boot_id != me.boot_id {
        return None;
    }
    gone(file)
}

/// Whether the file found at an incarnation's lock path (`found`, by `fstat` of the descriptor
/// whose flock is tested) is the one the incarnation locked (`locked`, as its heartbeat names
/// it): only then does its flock say anything of the incarnation.
pub fn same_lock_file(found: FileId, locked: FileId) -> bool {
    found == locked || !mutation::on(Guard::LockFileInode)
}
