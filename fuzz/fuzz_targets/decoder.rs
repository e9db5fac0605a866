//! The socket protocol decoder (`tfinit::protocol::Decoder`): whatever a peer sends, the init's
//! decoder must not panic, must never hand out a frame longer than MAX_PAYLOAD, and must decode
//! the same frames however the bytes are split across reads.
//!
//! Input layout: byte 0 is K (only K % 16 counts), then K big-endian u16 chunk lengths, then the
//! bytes a peer sends. A seed made from a real frame sequence is `\0` followed by the frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tfinit::protocol::{self, DecodeError, Decoder, Frame, HEADER, MAX_PAYLOAD};

/// Takes every frame out of `d`; the error, if the stream turned invalid.
fn drain(d: &mut Decoder, out: &mut Vec<Frame>) -> Option<DecodeError> {
    loop {
        match d.next_frame() {
            Ok(Some(f)) => {
                assert!(
                    f.payload.len() <= MAX_PAYLOAD,
                    "frame of {} bytes",
                    f.payload.len()
                );
                out.push(f);
            }
            Ok(None) => return None,
            Err(e) => {
                // An error is final: asking again gives the same error, never a frame.
                let again = d.next_frame();
                assert!(matches!(&again, Err(x) if *x == e), "{again:?} after {e:?}");
                return Some(e);
            }
        }
    }
}

/// Decodes `wire` pushed in pieces of the given lengths (cycled; 0 counts as 1).
fn decode_split(wire: &[u8], cuts: &[usize]) -> (Vec<Frame>, Option<DecodeError>, usize) {
    let mut d = Decoder::new(MAX_PAYLOAD);
    let mut frames = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < wire.len() {
        let n = cuts
            .get(i % cuts.len().max(1))
            .copied()
            .unwrap_or(wire.len())
            .max(1);
        let end = (at + n).min(wire.len());
        d.push(&wire[at..end]);
        at = end;
        i += 1;
        if let Some(e) = drain(&mut d, &mut frames) {
            return (frames, Some(e), d.pending());
        }
    }
    (frames, None, d.pending())
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let k = usize::from(k % 16).min(rest.len() / 2);
    let cuts: Vec<usize> = rest[..2 * k]
        .chunks(2)
        .map(|c| usize::from(u16::from_be_bytes([c[0], c[1]])))
        .collect();
    let wire = &rest[2 * k..];

    // All at once.
    let (whole, whole_err, whole_pending) = decode_split(wire, &[]);
    // Split where the input says.
    let (split, split_err, split_pending) = decode_split(wire, &cuts);
    assert_eq!(whole, split, "frames differ when the input is split");
    assert_eq!(
        whole_err, split_err,
        "errors differ when the input is split"
    );
    // One byte at a time (the worst case for a reader), for inputs of a sane size.
    if wire.len() <= 4096 {
        let (bytes, bytes_err, _) = decode_split(wire, &[1]);
        assert_eq!(whole, bytes);
        assert_eq!(whole_err, bytes_err);
    }

    // The frames are exactly a prefix of the input: re-encoding them gives those bytes back.
    let mut again = Vec::new();
    for f in &whole {
        protocol::encode(f.kind, &f.payload, &mut again);
    }
    assert_eq!(
        &wire[..again.len()],
        &again[..],
        "frames are not the input's prefix"
    );
    let left = &wire[again.len()..];
    match whole_err {
        // The error is about the next frame's header, and names what is wrong with it.
        Some(DecodeError::UnknownKind(b)) => assert_eq!(left.first(), Some(&b)),
        Some(DecodeError::TooLarge { len: n, limit }) => {
            assert!(n > limit && limit == MAX_PAYLOAD);
            assert!(left.len() >= HEADER);
            assert_eq!(
                n,
                u32::from_be_bytes([left[1], left[2], left[3], left[4]]) as usize
            );
        }
        None => {
            // Nothing decodable is left behind: what remains is an incomplete frame.
            assert_eq!(whole_pending, left.len());
            assert_eq!(split_pending, left.len());
            if left.len() >= HEADER {
                let (_, len) =
                    protocol::parse_header([left[0], left[1], left[2], left[3], left[4]], MAX_PAYLOAD)
                        .expect("a valid header was left undecoded");
                assert!(
                    left.len() < HEADER + len,
                    "a whole frame was left undecoded"
                );
            }
        }
    }
});
