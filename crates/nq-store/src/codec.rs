//! Byte encodings of keys and values.
//!
//! Keys are big-endian so that sled's lexicographic order is numeric order
//! (job 2 sorts before job 10, and a job's solution batches sort together).
//! Values are a tiny hand-written format: fixed-width big-endian integers,
//! LEB128 varints for counts (most counts are small, and an all-zero result
//! of a synthetic load test then costs one byte per field), and strings with a
//! varint length. Every value starts with a format version byte, so a later
//! release can read what this one wrote.

use crate::error::{Corruption, Error, Result};

/// Appends `v` as a LEB128 varint (7 bits per byte, low bits first).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u128) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends a string as a varint length and its UTF-8 bytes.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u128);
    out.extend_from_slice(s.as_bytes());
}

/// A cursor over a stored value. Every read names the tree it reads from, so
/// a corrupt value is reported with its location.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    tree: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(tree: &'static str, bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, tree }
    }

    pub(crate) fn corrupt(&self, what: Corruption) -> Error {
        Error::Corrupt {
            tree: self.tree,
            what,
        }
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < len {
            return Err(self.corrupt(Corruption::Truncated));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A byte that must be 0 (false) or 1 (true); any other is a damaged
    /// `field`, never read as either.
    pub(crate) fn flag(&mut self, field: &'static str) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.corrupt(Corruption::Field { field })),
        }
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes(b.try_into().expect("took 4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("took 8 bytes")))
    }

    pub(crate) fn varint(&mut self) -> Result<u128> {
        let mut v = 0u128;
        for shift in (0..128).step_by(7) {
            let byte = self.u8()?;
            let bits = u128::from(byte & 0x7f);
            // The 19th byte may carry only the top 2 bits of a u128.
            if shift == 126 && bits > 0b11 {
                return Err(self.corrupt(Corruption::Varint));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.corrupt(Corruption::Varint))
    }

    pub(crate) fn varint_u64(&mut self) -> Result<u64> {
        let v = self.varint()?;
        u64::try_from(v).map_err(|_| self.corrupt(Corruption::Varint))
    }

    pub(crate) fn str(&mut self) -> Result<String> {
        let len = self.varint()?;
        let len =
            usize::try_from(len).map_err(|_| self.corrupt(Corruption::Truncated))?;
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.corrupt(Corruption::Utf8))
    }

    /// How many bytes are not read yet. A decoder bounds what it reserves
    /// by this, never by a length field alone: a damaged length must not
    /// make a few bytes reserve megabytes.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// Fails unless every byte was read.
    pub(crate) fn end(&self) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.corrupt(Corruption::TrailingBytes))
        }
    }
}

/// Appends the CRC-32 of everything in `out` so far, so that a value damaged
/// at rest (a flipped bit on disk, a torn write sled did not catch) is refused
/// when read instead of being counted.
pub(crate) fn seal(out: &mut Vec<u8>) {
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// The part of a sealed value before its checksum, once the checksum matches.
pub(crate) fn unseal<'a>(tree: &'static str, bytes: &'a [u8]) -> Result<&'a [u8]> {
    let corrupt = |what| Error::Corrupt { tree, what };
    let split = bytes
        .len()
        .checked_sub(4)
        .ok_or(corrupt(Corruption::Truncated))?;
    let (body, crc) = bytes.split_at(split);
    let stored = u32::from_be_bytes(crc.try_into().expect("split 4 bytes off"));
    if crc32fast::hash(body) == stored {
        Ok(body)
    } else {
        Err(corrupt(Corruption::Checksum))
    }
}

/// Opens a value whose first byte is its format version, for formats sealed
/// (a CRC-32 after the value, see [`seal`]) from version `sealed_from` on:
/// refuses a version before that ([`Corruption::Unsealed`]: nothing could
/// tell whether it is intact), checks the checksum, then that the version is
/// one this build reads (`sealed_from` to `current`). Returns the version and
/// a reader over the fields after it, without the checksum.
///
/// The checksum is checked before the version is judged, so a damaged
/// version byte reads as damage, not as a value from a newer program.
pub(crate) fn open<'a>(
    tree: &'static str,
    bytes: &'a [u8],
    sealed_from: u8,
    current: u8,
) -> Result<(u8, Reader<'a>)> {
    let version = *bytes.first().ok_or(Error::Corrupt {
        tree,
        what: Corruption::Truncated,
    })?;
    if (1..sealed_from).contains(&version) {
        return Err(Error::Corrupt {
            tree,
            what: Corruption::Unsealed { found: version },
        });
    }
    let mut r = Reader::new(tree, unseal(tree, bytes)?);
    r.u8()?;
    if version == 0 || version > current {
        return Err(r.corrupt(Corruption::Version {
            found: version,
            expected: current,
        }));
    }
    Ok((version, r))
}

/// Reads a big-endian `u64` key.
pub(crate) fn key_u64(tree: &'static str, key: &[u8]) -> Result<u64> {
    let mut r = Reader::new(tree, key);
    let v = r.u64()?;
    r.end()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_every_width() {
        let values = [
            0u128,
            1,
            127,
            128,
            300,
            u64::MAX.into(),
            u128::MAX,
            1 << 126,
        ];
        for v in values {
            let mut buf = vec![];
            put_varint(&mut buf, v);
            let mut r = Reader::new("t", &buf);
            assert_eq!(r.varint().unwrap(), v);
            r.end().unwrap();
        }
        let mut buf = vec![];
        put_varint(&mut buf, 0);
        assert_eq!(buf, [0], "zero costs one byte");
    }

    #[test]
    fn truncated_and_overlong_values_are_corrupt() {
        let mut r = Reader::new("t", &[0x80]);
        assert!(matches!(r.varint(), Err(Error::Corrupt { .. })));
        let overlong = [0xffu8; 20];
        let mut r = Reader::new("t", &overlong);
        assert!(r.varint().is_err());
        let mut r = Reader::new("t", &[1, 2]);
        assert!(r.u32().is_err());
    }
}
