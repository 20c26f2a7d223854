//! Client-side encryption of backups with `age` (X25519): a [`Sealer`] encrypts a snapshot
//! chunk by chunk as it streams to the store, to a recipient (the public key only), and
//! [`open`] decrypts one for a restore, the only reader of an identity. Nothing
//! is held whole: age's stream cipher works in 64 KiB chunks.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use age::x25519::Identity;
use ichor_api::names::reasons;

use crate::controller::backup::Failure;

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
pub fn identity(text: &str) -> Result<Identity, String> {
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .unwrap_or("")
        .parse::<Identity>()
        .map_err(|err| format!("not an age X25519 identity (AGE-SECRET-KEY-1…): {err}"))
}

/// Reads an age X25519 recipient (`age1…`, a public key), saying what is wrong with a bad one.
pub fn recipient(text: &str) -> Result<age::x25519::Recipient, String> {
    text.trim()
        .parse::<age::x25519::Recipient>()
        .map_err(|err| format!("not an age X25519 recipient (age1…): {err}"))
}

impl Sealer {
    /// A sealer to `recipient` (`age1…`): a backup needs only the public key.
    pub fn for_recipient(recipient_text: &str) -> Result<Self, String> {
        let recipient = recipient(recipient_text)?;
        let encryptor =
            age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient))
                .map_err(|err| err.to_string())?;
        let pending = Pending::default();
        let writer = encryptor
            .wrap_output(pending.clone())
            .map_err(|err| err.to_string())?;
        Ok(Self { writer, pending })
    }

    /// Encrypts `chunk`; returns the ciphertext ready so far (possibly none).
    pub fn seal(&mut self, chunk: &[u8]) -> Result<Vec<u8>, Failure> {
        self.writer.write_all(chunk).map_err(encrypt_failed)?;
        Ok(self.pending.take())
    }

    /// Ends the stream; returns the last ciphertext.
    pub fn finish(self) -> Result<Vec<u8>, Failure> {
        let pending = self.writer.finish().map_err(encrypt_failed)?;
        Ok(pending.take())
    }
}

fn encrypt_failed(err: io::Error) -> Failure {
    Failure {
        reason: reasons::INTERNAL_ERROR,
        message: format!("cannot encrypt the snapshot: {err}"),
    }
}

/// Decrypts the age stream `input` with `identity`. A stream not encrypted to it is an error
/// before any plaintext is read.
pub fn open<R: Read>(input: R, identity: &Identity) -> Result<impl Read, String> {
    let decryptor = age::Decryptor::new(input).map_err(|err| err.to_string())?;
    decryptor
        .decrypt(std::iter::once(identity as &dyn age::Identity))
        .map_err(|err| err.to_string())
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
