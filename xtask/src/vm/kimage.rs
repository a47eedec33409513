//! The uncompressed kernel (vmlinux) inside a bzImage. Under TCG the kernel's own decompressor
//! costs seconds per boot (xz: ~4 s for 6.1), so the base image keeps the vmlinux, decompressed
//! once on the host, and QEMU boots it through its PVH entry point (CONFIG_PVH).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Xz,
    Zstd,
}

impl Compression {
    /// The host tool that decompresses it.
    pub fn tool(self) -> &'static str {
        match self {
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
        }
    }
}

/// The compressed kernel in a bzImage (x86 boot protocol >= 2.08): its format, bytes, and the
/// uncompressed size that the build appends as the payload's last 4 bytes.
pub fn payload(bz: &[u8]) -> Result<(Compression, &[u8], usize)> {
    let le32 = |at: usize| -> Result<u32> {
        let b = bz.get(at..at + 4).context("bzImage too short")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if bz.get(0x202..0x206) != Some(b"HdrS") {
        bail!("not a bzImage (no HdrS)");
    }
    let version = u16::from_le_bytes([bz[0x206], bz[0x207]]);
    if version < 0x208 {
        bail!("boot protocol {version:#x} has no payload fields");
    }
    let setup_sects = match bz[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let start = (setup_sects + 1) * 512 + le32(0x248)? as usize;
    let len = le32(0x24c)? as usize;
    let data = bz
        .get(start..start + len)
        .context("bzImage payload out of bounds")?;
    let (compressed, size) = data.split_at(len.checked_sub(4).context("empty payload")?);
    let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]) as usize;
    let kind = if compressed.starts_with(b"\xfd7zXZ\0") {
        Compression::Xz
    } else if compressed.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        bail!("the bzImage payload is neither xz nor zstd");
    };
    Ok((kind, compressed, size))
}

/// Decompresses the payload of the bzImage `bz` with the host tool; `tmp` is a scratch file.
/// `Ok(None)` when the tool is not installed.
pub fn vmlinux(bz: &[u8], tmp: &Path) -> Result<Option<Vec<u8>>> {
    let (kind, compressed, size) = payload(bz)?;
    std::fs::write(tmp, compressed).with_context(|| format!("writing {}", tmp.display()))?;
    let out = match Command::new(kind.tool()).arg("-dc").arg(tmp).output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.with_context(|| format!("running {}", kind.tool()))?,
    };
    let _ = std::fs::remove_file(tmp);
    if !out.status.success() {
        bail!(
            "{} -dc of the kernel failed: {}",
            kind.tool(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if out.stdout.len() != size || !out.stdout.starts_with(b"\x7fELF") {
        bail!(
            "the decompressed kernel is not an ELF of {size} bytes ({} bytes)",
            out.stdout.len()
        );
    }
    Ok(Some(out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bzimage(setup_sects: u8, payload_offset: u32, payload: &[u8]) -> Vec<u8> {
        let start = (usize::from(if setup_sects == 0 { 4 } else { setup_sects }) + 1) * 512;
        let mut b = vec![0u8; start + payload_offset as usize];
        b[0x1f1] = setup_sects;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        b[0x248..0x24c].copy_from_slice(&payload_offset.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b.extend_from_slice(payload);
        b.extend_from_slice(b"trailing");
        b
    }

    #[test]
    fn finds_the_payload() {
        let mut p = b"\xfd7zXZ\0data".to_vec();
        p.extend_from_slice(&1234u32.to_le_bytes());
        let bz = bzimage(0, 0x10, &p);
        let (kind, compressed, size) = payload(&bz).unwrap();
        assert_eq!(kind, Compression::Xz);
        assert_eq!(compressed, b"\xfd7zXZ\0data");
        assert_eq!(size, 1234);

        let mut p = vec![0x28, 0xb5, 0x2f, 0xfd, 1];
        p.extend_from_slice(&7u32.to_le_bytes());
        let bz = bzimage(30, 0, &p);
        let (kind, compressed, size) = payload(&bz).unwrap();
        assert_eq!((kind, compressed.len(), size), (Compression::Zstd, 5, 7));
    }

    #[test]
    fn rejects_other_images() {
        assert!(payload(b"\x7fELF").is_err());
        let mut p = b"gzip?".to_vec();
        p.extend_from_slice(&1u32.to_le_bytes());
        assert!(payload(&bzimage(0, 0, &p)).is_err());
    }
}
