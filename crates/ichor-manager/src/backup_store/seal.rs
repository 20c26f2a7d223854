//! Client-side encryption of backups with `age` (X25519): a [`Sealer`] encrypts a snapshot
//! chunk by chunk as it streams to the store, to a recipient (the public key only), and
//! [`open`] decrypts one for a restore, the only reader of an identity. Nothing
//! is held whole: age's stream cipher works in 64 KiB chunks.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use age::x25519::Identity;

/// What is wrong with an age key, or what failed while sealing or opening a stream.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The text is no age X25519 identity.
    #[error("not an age X25519 identity (AGE-SECRET-KEY-1…): {0}")]
    Identity(&'static str),
    /// The text is no age X25519 recipient.
    #[error("not an age X25519 recipient (age1…): {0}")]
    Recipient(&'static str),
    /// age refused to encrypt to the recipient.
    #[error(transparent)]
    Encryptor(#[from] age::EncryptError),
    /// The encrypted stream could not be started.
    #[error(transparent)]
    Start(io::Error),
    /// A chunk of the snapshot could not be encrypted.
    #[error("cannot encrypt the snapshot: {0}")]
    Encrypt(io::Error),
    /// The stream is not age, or not encrypted to the identity.
    #[error(transparent)]
    Decrypt(#[from] age::DecryptError),
}

/// Bytes the age stream writer has written, waiting to be taken.
#[derive(Clone, Default)]
struct Pending(Arc<Mutex<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|mut bytes| std::mem::take(&mut *bytes))
            .unwrap_or_default()
    }
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Encrypts a stream to one age recipient.
pub struct Sealer {
    writer: age::stream::StreamWriter<Pending>,
    pending: Pending,
}

/// Reads an age X25519 identity (`AGE-SECRET-KEY-1…`), saying what is wrong with a bad one.
pub fn identity(text: &str) -> Result<Identity, SealError> {
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .unwrap_or("")
        .parse::<Identity>()
        .map_err(SealError::Identity)
}

/// Reads an age X25519 recipient (`age1…`, a public key), saying what is wrong with a bad one.
pub fn recipient(text: &str) -> Result<age::x25519::Recipient, SealError> {
    text.trim()
        .parse::<age::x25519::Recipient>()
        .map_err(SealError::Recipient)
}

impl Sealer {
    /// A sealer to `recipient` (`age1…`): a backup needs only the public key.
    pub fn for_recipient(recipient_text: &str) -> Result<Self, SealError> {
        let recipient = recipient(recipient_text)?;
        let encryptor =
            age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient))?;
        let pending = Pending::default();
        let writer = encryptor
            .wrap_output(pending.clone())
            .map_err(SealError::Start)?;
        Ok(Self { writer, pending })
    }

    /// Encrypts `chunk`; returns the ciphertext ready so far (possibly none).
    pub fn seal(&mut self, chunk: &[u8]) -> Result<Vec<u8>, SealError> {
        self.writer.write_all(chunk).map_err(SealError::Encrypt)?;
        Ok(self.pending.take())
    }

    /// Ends the stream; returns the last ciphertext.
    pub fn finish(self) -> Result<Vec<u8>, SealError> {
        let pending = self.writer.finish().map_err(SealError::Encrypt)?;
        Ok(pending.take())
    }
}

/// Decrypts the age stream `input` with `identity`. A stream not encrypted to it is an error
/// before any plaintext is read.
pub fn open<R: Read>(input: R, identity: &Identity) -> Result<impl Read, SealError> {
    let decryptor = age::Decryptor::new(input)?;
    Ok(decryptor.decrypt(std::iter::once(identity as &dyn age::Identity))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_sealed_in_chunks_opens_with_the_identity_and_no_other() {
        let id = Identity::generate();
        let mut sealer = Sealer::for_recipient(&format!("{}\n", id.to_public())).expect("sealer");
        let plain: Vec<u8> = (0..200_000u32).map(|n| (n % 251) as u8).collect();
        let mut sealed = Vec::new();
        for chunk in plain.chunks(1024) {
            sealed.extend(sealer.seal(chunk).expect("seal"));
        }
        sealed.extend(sealer.finish().expect("finish"));
        assert_ne!(sealed[..64], plain[..64]);
        let mut opened = Vec::new();
        open(sealed.as_slice(), &id)
            .expect("open")
            .read_to_end(&mut opened)
            .expect("read");
        assert_eq!(opened, plain);
        assert!(open(sealed.as_slice(), &Identity::generate()).is_err());
        assert!(Sealer::for_recipient("age1notakey").is_err());
        let identity_text = {
            use age::secrecy::ExposeSecret as _;
            id.to_string().expose_secret().to_owned()
        };
        assert!(
            Sealer::for_recipient(&identity_text).is_err(),
            "an identity is no recipient"
        );
        assert!(identity(&format!("# created\n{identity_text}\n")).is_ok());
    }
}
