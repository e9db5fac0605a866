//! Programs that talk to a running init: the terraform shim and the control commands.

pub mod control;
pub mod shim;

use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::protocol::{self, FileId, Kind};

/// What `path` is (device and inode), following symbolic links as a chdir would; None when it
/// cannot be stat'ed. Called in the client processes only: a stat in a working directory may
/// hang on its volume, which must never stall the init's loop.
pub(crate) fn file_id(path: &Path) -> Option<FileId> {
    let m = std::fs::metadata(path).ok()?;
    Some(FileId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Reads one whole frame from a blocking stream into `payload`; None at a clean end of stream.
pub fn read_frame(sock: &mut UnixStream, payload: &mut Vec<u8>) -> io::Result<Option<Kind>> {
    let mut header = [0u8; protocol::HEADER];
    let mut got = 0;
    while got < header.len() {
        match sock.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let (kind, len) = protocol::parse_header(header, protocol::MAX_PAYLOAD)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    payload.resize(len, 0);
    sock.read_exact(payload)?;
    Ok(Some(kind))
}

/// Writes one frame to a blocking stream.
pub(crate) fn write_frame(sock: &mut UnixStream, kind: Kind, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(protocol::HEADER + payload.len());
    protocol::encode(kind, payload, &mut buf);
    sock.write_all(&buf)
}
