//! A minimal writer for the "newc" cpio format (SVR4, no CRC) that the kernel unpacks as an
//! initramfs. Archives may be concatenated: the kernel unpacks each in turn, later entries win.

use std::io::{self, Write};

const MAGIC: &[u8; 6] = b"070701";
const TRAILER: &str = "TRAILER!!!";

pub const S_IFDIR: u32 = 0o040_000;
pub const S_IFREG: u32 = 0o100_000;
pub const S_IFLNK: u32 = 0o120_000;

/// Writes entries one by one; `finish` adds the trailer. Paths are relative (no leading `/`);
/// parents must be written before their children. Owner is root, mtime 0 (reproducible output).
pub struct Writer<W: Write> {
    out: W,
    next_ino: u32,
    offset: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer {
            out,
            next_ino: 1,
            offset: 0,
        }
    }

    pub fn dir(&mut self, path: &str, perm: u32) -> io::Result<()> {
        self.entry(path, S_IFDIR | (perm & 0o7777), 2, &[])
    }

    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | (perm & 0o7777), 1, data)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.entry(path, S_IFLNK | 0o777, 1, target.as_bytes())
    }

    /// Writes the trailer and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.header(0, 0, 1, 0, TRAILER)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, path: &str, mode: u32, nlink: u32, data: &[u8]) -> io::Result<()> {
        let path = path.trim_start_matches('/');
        if path.is_empty() || path == TRAILER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cpio path {path:?}"),
            ));
        }
        let size = u32::try_from(data.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{path} is too large for cpio"),
            )
        })?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.header(ino, mode, nlink, size, path)?;
        self.write(data)?;
        self.pad()
    }

    fn header(&mut self, ino: u32, mode: u32, nlink: u32, size: u32, name: &str) -> io::Result<()> {
        let namesize = u32::try_from(name.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cpio name too long"))?;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
        let fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, namesize, 0];
        let mut h = Vec::with_capacity(110 + name.len() + 4);
        h.extend_from_slice(MAGIC);
        for f in fields {
            h.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        h.extend_from_slice(name.as_bytes());
        h.push(0);
        self.write(&h)?;
        self.pad()
    }

    fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.offset += b.len() as u64;
        Ok(())
    }

    /// Pads to a multiple of 4 bytes from the start of the archive.
    fn pad(&mut self) -> io::Result<()> {
        let n = ((4 - self.offset % 4) % 4) as usize;
        self.write(&[0; 3][..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Entry {
        fields: [u32; 13],
        name: String,
        data: Vec<u8>,
    }

    /// A reader for the tests: checks magic and alignment of every part; returns the entries up
    /// to and including the trailer, and what follows it.
    fn parse_one(mut b: &[u8]) -> (Vec<Entry>, &[u8]) {
        let total = b.len();
        let mut out = Vec::new();
        loop {
            assert_eq!((total - b.len()) % 4, 0, "header not 4-aligned");
            assert_eq!(&b[..6], MAGIC);
            let mut fields = [0u32; 13];
            for (i, f) in fields.iter_mut().enumerate() {
                let s = std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap();
                *f = u32::from_str_radix(s, 16).unwrap();
            }
            let namesize = fields[11] as usize;
            let name_end = 110 + namesize;
            assert_eq!(b[name_end - 1], 0, "name not NUL-terminated");
            let name = String::from_utf8(b[110..name_end - 1].to_vec()).unwrap();
            let data_start = name_end.next_multiple_of(4);
            assert!(b[name_end..data_start].iter().all(|&x| x == 0));
            let size = fields[6] as usize;
            let data = b[data_start..data_start + size].to_vec();
            let next = (data_start + size).next_multiple_of(4);
            assert!(b[data_start + size..next].iter().all(|&x| x == 0));
            b = &b[next..];
            let done = name == TRAILER;
            out.push(Entry { fields, name, data });
            if done {
                return (out, b);
            }
        }
    }

    fn parse(b: &[u8]) -> Vec<Entry> {
        let (entries, rest) = parse_one(b);
        assert!(rest.is_empty(), "bytes after trailer");
        entries
    }

    #[test]
    fn round_trip_and_format() {
        let mut w = Writer::new(Vec::new());
        w.dir("usr", 0o755).unwrap();
        w.file("/usr/init", 0o100_755, b"#!/bin/sh\n").unwrap();
        w.symlink("bin", "usr/bin").unwrap();
        w.file("e", 0o644, b"").unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let entries = parse(&bytes);
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["usr", "usr/init", "bin", "e", TRAILER]);

        let d = &entries[0];
        assert_eq!(d.fields[1], S_IFDIR | 0o755);
        assert_eq!(d.fields[4], 2);
        let f = &entries[1];
        assert_eq!(f.fields[0], 2, "inode numbers count up");
        assert_eq!(
            f.fields[1],
            S_IFREG | 0o755,
            "file type bits come from the writer"
        );
        assert_eq!(
            (f.fields[2], f.fields[3], f.fields[5]),
            (0, 0, 0),
            "uid gid mtime"
        );
        assert_eq!(f.fields[6], 10);
        assert_eq!(f.fields[11], "usr/init".len() as u32 + 1);
        assert_eq!(f.data, b"#!/bin/sh\n");
        let l = &entries[2];
        assert_eq!(l.fields[1], S_IFLNK | 0o777);
        assert_eq!(l.data, b"usr/bin");
        assert_eq!(entries[3].fields[6], 0);
        let t = &entries[4];
        assert_eq!(t.fields, [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 11, 0]);
    }

    #[test]
    fn exact_header_bytes() {
        let mut w = Writer::new(Vec::new());
        w.file("a", 0o644, b"xyz").unwrap();
        let bytes = w.finish().unwrap();
        let expect_header = [
            "070701", "00000001", "000081a4", "00000000", "00000000", "00000001", "00000000",
            "00000003", "00000000", "00000000", "00000000", "00000000", "00000002", "00000000",
        ]
        .concat();
        // 110 header bytes, "a\0", pad to 112, "xyz", pad to 116.
        assert_eq!(expect_header.len(), 110);
        assert_eq!(&bytes[..110], expect_header.as_bytes());
        assert_eq!(&bytes[110..112], b"a\0");
        assert_eq!(&bytes[112..116], b"xyz\0");
        assert_eq!(&bytes[116..122], MAGIC);
    }

    #[test]
    fn rejects_bad_paths() {
        let mut w = Writer::new(Vec::new());
        assert!(w.file("/", 0o644, b"").is_err());
        assert!(w.file(TRAILER, 0o644, b"").is_err());
    }

    #[test]
    fn concatenated_archives_stay_aligned() {
        let mut a = Writer::new(Vec::new());
        a.file("x", 0o600, b"12345").unwrap();
        let mut bytes = a.finish().unwrap();
        let mut b = Writer::new(Vec::new());
        b.file("y", 0o600, b"1").unwrap();
        bytes.extend(b.finish().unwrap());
        let (first, rest) = parse_one(&bytes);
        assert_eq!(first.len(), 2);
        assert_eq!((bytes.len() - rest.len()) % 4, 0);
        let second = parse(rest);
        assert_eq!(second[0].name, "y");
        assert_eq!(second[0].data, b"1");
    }
}
