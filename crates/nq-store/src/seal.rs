//! Keyed sealing: the store key, and the trees whose every value it vouches
//! for.
//!
//! A CRC-32 (see `codec`) catches a value damaged at rest, but not one that
//! was edited: whoever can write the data directory can recompute a CRC, and
//! nq-store's own API does exactly that. With a [`StoreKey`], kept OUTSIDE
//! the data directory, every value of every tree is followed by a tag: the
//! HMAC-SHA256 of the store's salt, the tree's name, the value's key and the
//! value. A value edited, written or moved to another key (or from another
//! store sealed with the same key) by someone without the key fails its tag
//! when it is read, and is refused as [`Error::Tampered`], naming the record.
//!
//! The tag binds a value to its place, not to its time: a value copied back
//! from an earlier state of the same key (a rollback), or deleted, is not
//! detected here. Nor can a key protect against whoever holds it.
//!
//! The `meta` tree also holds the store's seal record, written when a keyed
//! store is first opened: a random salt drawn then, and the key's check
//! value (an HMAC of a fixed string and the salt). It marks the store as
//! keyed, so that opening it without the key or with another key fails at
//! once ([`Error::KeyNeeded`], [`Error::WrongKey`]), and opening an unkeyed
//! store with a key fails too ([`Error::NotKeyed`]): a store is keyed from
//! its creation or never.
//!
//! Without a key the store's trees pass values through unchanged, which costs
//! nothing.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ring::hmac;
use sled::IVec;
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// Bytes of the tag after each value of a keyed store (a full HMAC-SHA256).
pub const TAG_LEN: usize = 32;

/// The shortest key accepted, in bytes: 128 bits.
pub const MIN_KEY_BYTES: usize = 16;

/// The longest key accepted, in bytes (HMAC-SHA256's block size; a longer
/// key is hashed down to 32 bytes anyway).
pub const MAX_KEY_BYTES: usize = 64;

/// What the key's check value is the MAC of (with the salt). Versioned with
/// the tag layout.
const CHECK_INPUT: &[u8] = b"nq-store key check v1\0";

/// Bytes of a store's salt.
const SALT_LEN: usize = 16;

/// Bytes of the key's check value.
const CHECK_LEN: usize = 16;

/// Opens every tag's input, so that a tag of this layout can never be
/// mistaken for a MAC the same key made of anything else.
const TAG_DOMAIN: &[u8] = b"nq-store seal v1\0";

/// The secret that seals a store's values. Its `Debug` form shows nothing of
/// it.
#[derive(Clone)]
pub struct StoreKey {
    hmac: hmac::Key,
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreKey(..)")
    }
}

/// Why a store key was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is shorter than [`MIN_KEY_BYTES`] or longer than
    /// [`MAX_KEY_BYTES`].
    #[error(
        "a store key must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, this one is \
         {bytes}; make one with `openssl rand -hex 32`"
    )]
    Length {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The text is neither hex nor base64.
    #[error(
        "a store key is written in hex (64 hex digits for 32 bytes) or in \
         base64; this text is neither; make one with `openssl rand -hex 32`"
    )]
    Encoding,
    /// The key file cannot be read.
    #[error("cannot read the store key file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl StoreKey {
    /// A key of `bytes`, [`MIN_KEY_BYTES`] to [`MAX_KEY_BYTES`] long.
    ///
    /// # Errors
    ///
    /// [`KeyError::Length`] for any other length.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<StoreKey, KeyError> {
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
            return Err(KeyError::Length { bytes: bytes.len() });
        }
        Ok(StoreKey {
            hmac: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        })
    }

    /// A key written as text: hex when every character is a hex digit (and
    /// their number is even), base64 (standard alphabet, padding optional)
    /// otherwise. Surrounding white space is ignored.
    ///
    /// # Errors
    ///
    /// [`KeyError::Encoding`], [`KeyError::Length`].
    pub fn parse(text: &str) -> std::result::Result<StoreKey, KeyError> {
        use base64::Engine;
        let text = text.trim();
        let bytes = if !text.is_empty()
            && text.len().is_multiple_of(2)
            && text.bytes().all(|b| b.is_ascii_hexdigit())
        {
            (0..text.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&text[i..i + 2], 16))
                .collect::<std::result::Result<Vec<u8>, _>>()
                .map_err(|_| KeyError::Encoding)?
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .or_else(|_| {
                    base64::engine::general_purpose::STANDARD_NO_PAD.decode(text)
                })
                .map_err(|_| KeyError::Encoding)?
        };
        StoreKey::from_bytes(&bytes)
    }

    /// The key in the file at `path`, written as [`StoreKey::parse`] reads it.
    ///
    /// # Errors
    ///
    /// [`KeyError::Read`], and as [`StoreKey::parse`].
    pub fn load(path: &Path) -> std::result::Result<StoreKey, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        StoreKey::parse(&text)
    }

    /// The key's check value for a store of `salt`: a MAC of a fixed string
    /// and the salt, stored in a keyed store so that a wrong key is refused at
    /// open rather than at the first value it reads. It tells nothing of the
    /// key.
    fn check_value(&self, salt: &[u8; SALT_LEN]) -> [u8; CHECK_LEN] {
        let mut mac = hmac::Context::with_key(&self.hmac);
        mac.update(CHECK_INPUT);
        mac.update(salt);
        mac.sign().as_ref()[..CHECK_LEN]
            .try_into()
            .expect("a tag has 32 bytes")
    }
}

/// A store key bound to one store by the store's salt: what seals its
/// values.
pub(crate) struct Sealer {
    key: StoreKey,
    salt: [u8; SALT_LEN],
}

impl Sealer {
    /// The tag of `value` stored under `key` in `tree`.
    fn tag(&self, tree: &str, key: &[u8], value: &[u8]) -> hmac::Tag {
        let mut mac = hmac::Context::with_key(&self.key.hmac);
        mac.update(TAG_DOMAIN);
        mac.update(&self.salt);
        // Tree names hold no NUL, and the key's length comes before it: no
        // two (tree, key, value) triples give the same input.
        mac.update(tree.as_bytes());
        mac.update(&[0]);
        mac.update(&(key.len() as u32).to_be_bytes());
        mac.update(key);
        mac.update(value);
        mac.sign()
    }
}

/// The sealer of a store whose `meta` tree is `meta` (raw), opened with
/// `key`: checks the key against the store's seal record (stored under
/// `record` in `meta`), or, for an empty store opened with a key, draws a
/// salt and writes the record durably before anything else. `others` are
/// the trees that must be empty too for a store to count as empty. `None`
/// for an unkeyed store.
pub(crate) fn open_sealer(
    db: &sled::Db,
    meta: &sled::Tree,
    record: &[u8],
    others: &[&sled::Tree],
    key: Option<StoreKey>,
    dir: PathBuf,
) -> Result<Option<Arc<Sealer>>> {
    let (key, stored) = match (key, meta.get(record)?) {
        (None, None) => return Ok(None),
        (None, Some(_)) => return Err(Error::KeyNeeded { dir }),
        (Some(key), stored) => (key, stored),
    };
    let Some(stored) = stored else {
        let empty = meta.is_empty() && others.iter().all(|t| t.is_empty());
        if !empty {
            return Err(Error::NotKeyed { dir });
        }
        let mut salt = [0u8; SALT_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
            .map_err(|_| Error::Random)?;
        let check = key.check_value(&salt);
        meta.insert(record, [&salt[..], &check[..]].concat())?;
        db.flush()?;
        return Ok(Some(Arc::new(Sealer { key, salt })));
    };
    let bad = || Error::Corrupt {
        tree: "meta",
        what: crate::Corruption::Field {
            field: "store key check",
        },
    };
    if stored.len() != SALT_LEN + CHECK_LEN {
        return Err(bad());
    }
    let salt: [u8; SALT_LEN] = stored[..SALT_LEN].try_into().map_err(|_| bad())?;
    if bool::from(key.check_value(&salt).ct_eq(&stored[SALT_LEN..])) {
        Ok(Some(Arc::new(Sealer { key, salt })))
    } else {
        Err(Error::WrongKey { dir })
    }
}

/// A sled tree whose values are sealed with the store key, if there is one.
///
/// Every read of a value checks its tag and returns the value without it;
/// every write appends one. Operations that neither read nor write a value
/// (removals, key scans) go to [`SealedTree::raw`].
#[derive(Clone)]
pub(crate) struct SealedTree {
    tree: sled::Tree,
    name: &'static str,
    sealer: Option<Arc<Sealer>>,
}

impl SealedTree {
    pub(crate) fn new(
        tree: sled::Tree,
        name: &'static str,
        sealer: Option<Arc<Sealer>>,
    ) -> SealedTree {
        SealedTree { tree, name, sealer }
    }

    /// The tree itself, for operations that do not touch values.
    pub(crate) fn raw(&self) -> &sled::Tree {
        &self.tree
    }

    /// `value` with its tag, as stored under `key`.
    fn seal(&self, key: &[u8], value: &[u8]) -> Vec<u8> {
        match &self.sealer {
            None => value.to_vec(),
            Some(k) => {
                let mut out = Vec::with_capacity(value.len() + TAG_LEN);
                out.extend_from_slice(value);
                out.extend_from_slice(k.tag(self.name, key, value).as_ref());
                out
            }
        }
    }

    /// The value stored under `key`, once its tag matches.
    fn open(&self, key: &[u8], stored: IVec) -> Result<IVec> {
        open_value(self.name, self.sealer.as_deref(), key, stored)
    }

    /// [`SealedTree::open`] on a borrowed value, without copying it.
    pub(crate) fn open_slice<'a>(
        &self,
        key: &[u8],
        stored: &'a [u8],
    ) -> Result<&'a [u8]> {
        let len = value_len(self.name, self.sealer.as_deref(), key, stored)?;
        Ok(&stored[..len])
    }

    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<IVec>> {
        let key = key.as_ref();
        self.tree.get(key)?.map(|v| self.open(key, v)).transpose()
    }

    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        let key = key.as_ref();
        let value = value.as_ref();
        match &self.sealer {
            None => self.tree.insert(key, value)?,
            Some(_) => self.tree.insert(key, self.seal(key, value))?,
        };
        Ok(())
    }

    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> Result<()> {
        self.tree.remove(key)?;
        Ok(())
    }

    /// Every entry, in key order, each value checked as it is read.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Result<(IVec, IVec)>> + 'static {
        self.entries(self.tree.iter())
    }

    /// The entries whose key starts with `prefix`, in key order.
    pub(crate) fn scan_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
    ) -> impl Iterator<Item = Result<(IVec, IVec)>> + 'static {
        self.entries(self.tree.scan_prefix(prefix))
    }

    /// The first entry after `after` (the first of all for `None`).
    pub(crate) fn first_after(
        &self,
        after: Option<&[u8]>,
    ) -> Result<Option<(IVec, IVec)>> {
        let next = match after {
            None => self.tree.iter().next(),
            Some(k) => self
                .tree
                .range::<&[u8], _>((
                    std::ops::Bound::Excluded(k),
                    std::ops::Bound::Unbounded,
                ))
                .next(),
        };
        next.map(|entry| {
            let (k, v) = entry?;
            let v = self.open(&k, v)?;
            Ok((k, v))
        })
        .transpose()
    }

    fn entries(
        &self,
        it: sled::Iter,
    ) -> impl Iterator<Item = Result<(IVec, IVec)>> + 'static {
        let (name, sealer) = (self.name, self.sealer.clone());
        it.map(move |entry| {
            let (k, v) = entry?;
            let v = open_value(name, sealer.as_deref(), &k, v)?;
            Ok((k, v))
        })
    }

    /// sled's `fetch_and_update` on opened values: `f` sees the old value
    /// without its tag and returns the new one without its tag. A stored
    /// value whose tag fails is left as it is and reported. Returns the old
    /// value.
    pub(crate) fn fetch_and_update(
        &self,
        key: impl AsRef<[u8]>,
        mut f: impl FnMut(Option<&[u8]>) -> Result<Option<Vec<u8>>>,
    ) -> Result<Option<IVec>> {
        let key = key.as_ref();
        let mut failure = None;
        let old = self.tree.fetch_and_update(key, |old| {
            failure = None;
            let opened = old.map(|bytes| self.open_slice(key, bytes)).transpose();
            match opened.and_then(&mut f) {
                Ok(new) => new.map(|v| self.seal(key, &v)),
                Err(e) => {
                    // Leave a value that fails as it is, and report it.
                    failure = Some(e);
                    old.map(<[u8]>::to_vec)
                }
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        old.map(|v| self.open(key, v)).transpose()
    }

    /// Stores `value` under `key` unless a value is there already; returns
    /// `Ok(None)` when it stored it, the stored value otherwise.
    pub(crate) fn insert_if_absent(
        &self,
        key: impl AsRef<[u8]>,
        value: &[u8],
    ) -> Result<Option<IVec>> {
        let key = key.as_ref();
        match self.tree.compare_and_swap(
            key,
            None::<&[u8]>,
            Some(self.seal(key, value)),
        )? {
            Ok(()) => Ok(None),
            Err(cas) => cas.current.map(|v| self.open(key, v)).transpose(),
        }
    }
}

/// `stored` without its tag, once the tag matches `key` in `tree` (`stored`
/// itself without a store key).
fn open_value(
    tree: &'static str,
    sealer: Option<&Sealer>,
    key: &[u8],
    stored: IVec,
) -> Result<IVec> {
    if sealer.is_none() {
        return Ok(stored);
    }
    let len = value_len(tree, sealer, key, &stored)?;
    Ok(stored.subslice(0, len))
}

/// The length of the value in `stored` once its tag matches `key` in
/// `tree` (all of it without a store key).
fn value_len(
    tree: &'static str,
    sealer: Option<&Sealer>,
    key: &[u8],
    stored: &[u8],
) -> Result<usize> {
    let Some(sealer) = sealer else {
        return Ok(stored.len());
    };
    let tampered = || Error::Tampered {
        tree,
        record: describe(tree, key),
    };
    let split = stored.len().checked_sub(TAG_LEN).ok_or_else(tampered)?;
    let (value, tag) = stored.split_at(split);
    let want = sealer.tag(tree, key, value);
    if bool::from(want.as_ref().ct_eq(tag)) {
        Ok(split)
    } else {
        Err(tampered())
    }
}

/// The record that `key` names in `tree`, in words, for errors.
pub(crate) fn describe(tree: &str, key: &[u8]) -> String {
    let u64_at = |at: usize| {
        key.get(at..at + 8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
    };
    let u32_at = |at: usize| {
        key.get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    let per = |chunk: u64, per: u64| {
        format!(
            "chunk {chunk} (jobs {} to {})",
            chunk.saturating_mul(per),
            chunk.saturating_mul(per).saturating_add(per - 1)
        )
    };
    match (tree, key.len()) {
        ("jobs", 8) => {
            format!("job {}", per(u64_at(0).unwrap_or(0), crate::JOBS_PER_CHUNK))
        }
        ("records", 8) => format!(
            "job record {}",
            per(u64_at(0).unwrap_or(0), crate::RECORDS_PER_CHUNK)
        ),
        ("duplicates", 16) => format!(
            "a repeated result of job {} (entry {})",
            u64_at(0).unwrap_or(0),
            u64_at(8).unwrap_or(0)
        ),
        ("solutions", 16) => format!(
            "the solutions of job {}, sub-problem {}, batch {}",
            u64_at(0).unwrap_or(0),
            u32_at(8).unwrap_or(0),
            u32_at(12).unwrap_or(0)
        ),
        ("order", 9) => format!(
            "the hand-out order chunk from job {}",
            u64_at(1).unwrap_or(0)
        ),
        ("meta", _) if key.iter().all(|b| b.is_ascii_graphic()) => {
            format!("`{}`", String::from_utf8_lossy(key))
        }
        _ => format!(
            "key {}",
            key.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> StoreKey {
        StoreKey::from_bytes(&[byte; 32]).unwrap()
    }

    fn sealer(key: StoreKey, salt: u8) -> Option<Arc<Sealer>> {
        Some(Arc::new(Sealer {
            key,
            salt: [salt; SALT_LEN],
        }))
    }

    fn tree(k: Option<StoreKey>) -> SealedTree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let sealer = k.and_then(|k| sealer(k, 0));
        SealedTree::new(db.open_tree("records").unwrap(), "records", sealer)
    }

    #[test]
    fn keys_parse_from_hex_and_base64_and_refuse_the_rest() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let from_hex = StoreKey::parse(&format!("{hex}\n")).unwrap();
        let bytes: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(
            from_hex.check_value(&[0; SALT_LEN]),
            StoreKey::from_bytes(&bytes)
                .unwrap()
                .check_value(&[0; SALT_LEN])
        );
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert_eq!(
            StoreKey::parse(&b64).unwrap().check_value(&[0; SALT_LEN]),
            from_hex.check_value(&[0; SALT_LEN])
        );
        let unpadded = b64.trim_end_matches('=');
        assert_eq!(
            StoreKey::parse(unpadded)
                .unwrap()
                .check_value(&[0; SALT_LEN]),
            from_hex.check_value(&[0; SALT_LEN])
        );
        for short in ["00112233", "AAAA"] {
            let err = StoreKey::parse(short).unwrap_err();
            assert!(matches!(err, KeyError::Length { .. }), "{short}: {err}");
            assert!(err.to_string().contains("16 to 64 bytes"), "{err}");
        }
        for bad in ["", "not a key!", "zz"] {
            let err = StoreKey::parse(bad).unwrap_err();
            assert!(
                matches!(err, KeyError::Encoding | KeyError::Length { .. }),
                "{bad}: {err}"
            );
        }
        assert_eq!(format!("{from_hex:?}"), "StoreKey(..)");
    }

    #[test]
    fn a_sealed_value_reads_back_and_only_with_its_key() {
        let k = key(7);
        let t = tree(Some(k.clone()));
        t.insert(1u64.to_be_bytes(), b"value").unwrap();
        assert_eq!(&*t.get(1u64.to_be_bytes()).unwrap().unwrap(), b"value");
        let raw = t.raw().get(1u64.to_be_bytes()).unwrap().unwrap();
        assert_eq!(raw.len(), 5 + TAG_LEN);
        // The same bytes read with another key fail, and so do they with
        // the same key in another store (another salt).
        for other in [sealer(key(8), 0), sealer(k.clone(), 1)] {
            let other = SealedTree::new(t.raw().clone(), "records", other);
            let err = other.get(1u64.to_be_bytes()).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Tampered {
                        tree: "records",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        // An unkeyed reader sees the tag as part of the value: the CRC
        // inside a real value then fails.
        assert_eq!(tree(None).seal(b"k", b"v"), b"v");
    }

    #[test]
    fn an_edited_or_moved_value_is_refused_naming_the_record() {
        let t = tree(Some(key(1)));
        t.insert(0u64.to_be_bytes(), b"count 92").unwrap();
        t.insert(1u64.to_be_bytes(), b"count 14").unwrap();
        // Edited in place, the old tag kept.
        let mut raw = t.raw().get(0u64.to_be_bytes()).unwrap().unwrap().to_vec();
        raw[6] = b'3';
        t.raw().insert(0u64.to_be_bytes(), raw).unwrap();
        let err = t.get(0u64.to_be_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .contains("job record chunk 0 (jobs 0 to 15)"),
            "{err}"
        );
        // A valid value moved to another key.
        let one = t.raw().get(1u64.to_be_bytes()).unwrap().unwrap();
        t.raw().insert(3u64.to_be_bytes(), one).unwrap();
        let err = t.get(3u64.to_be_bytes()).unwrap_err();
        assert!(err.to_string().contains("chunk 3 (jobs 48 to 63)"), "{err}");
        // A value with no tag at all, as an unkeyed writer leaves it.
        t.raw().insert(4u64.to_be_bytes(), &b"x"[..]).unwrap();
        assert!(t.get(4u64.to_be_bytes()).is_err());
        // Scans stop at the first bad value too.
        assert!(t.iter().any(|e| e.is_err()));
        assert_eq!(&*t.get(1u64.to_be_bytes()).unwrap().unwrap(), b"count 14");
    }

    #[test]
    fn updates_keep_the_seal_and_refuse_a_bad_old_value() {
        let t = tree(Some(key(3)));
        let add = |old: Option<&[u8]>| -> Result<Option<Vec<u8>>> {
            let n = old.map_or(0, |b| b[0]);
            Ok(Some(vec![n + 1]))
        };
        t.fetch_and_update(b"boot", add).unwrap();
        t.fetch_and_update(b"boot", add).unwrap();
        assert_eq!(&*t.get(b"boot").unwrap().unwrap(), &[2]);
        t.raw().insert(b"boot", &[9u8; 33][..]).unwrap();
        assert!(t.fetch_and_update(b"boot", add).is_err());
        assert_eq!(
            t.raw().get(b"boot").unwrap().unwrap().len(),
            33,
            "left as it was"
        );
        assert_eq!(t.insert_if_absent(b"s", b"first").unwrap(), None);
        assert_eq!(
            &*t.insert_if_absent(b"s", b"second").unwrap().unwrap(),
            b"first"
        );
    }
}
