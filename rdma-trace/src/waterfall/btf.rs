//! Just enough of the BTF format to find a struct member's byte offset, in vmlinux BTF or in a
//! module's split BTF (`/sys/kernel/btf/<module>`, whose type ids and string offsets continue
//! the base's).

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad magic or header)")]
    Header,
    #[error("BTF type section is truncated")]
    Truncated,
    #[error("BTF has no struct {0}")]
    NoStruct(String),
    #[error("struct {0} has no member {1}")]
    NoMember(String, String),
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
}

#[derive(Clone, Debug)]
struct Type {
    name: u32,
    kind: u32,
    /// Referenced type (modifiers, typedefs).
    ty: u32,
    members: Vec<Member>,
}

/// Types and strings of one BTF blob, optionally on top of a base.
#[derive(Clone)]
pub struct Btf {
    /// Index = type id (0 is void).
    types: Vec<Type>,
    strings: Vec<u8>,
}

fn u32_at(d: &[u8], off: usize) -> Result<u32, BtfError> {
    d.get(off..off + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(BtfError::Truncated)
}

impl Btf {
    /// Parse `data`; with `base`, `data` is split BTF continuing `base`.
    pub fn parse(data: &[u8], base: Option<Btf>) -> Result<Btf, BtfError> {
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Header);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_bytes = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Truncated)?;
        let strs = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Truncated)?;
        let (mut types, mut strings) = match base {
            Some(b) => (b.types, b.strings),
            None => (
                vec![Type {
                    name: 0,
                    kind: 0,
                    ty: 0,
                    members: Vec::new(),
                }],
                Vec::new(),
            ),
        };
        // Split BTF's string offsets continue the base's: appended, they index the whole.
        strings.extend_from_slice(strs);
        let mut p = 0;
        while p < types_bytes.len() {
            let name_off = u32_at(types_bytes, p)?;
            let info = u32_at(types_bytes, p + 4)?;
            let size_or_type = u32_at(types_bytes, p + 8)?;
            p += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 != 0;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // INT, VAR, DECL_TAG
                3 => 12,          // ARRAY
                KIND_STRUCT | KIND_UNION => {
                    for m in 0..vlen {
                        let at = p + 12 * m;
                        let off = u32_at(types_bytes, at + 8)?;
                        members.push(Member {
                            name: u32_at(types_bytes, at)?,
                            ty: u32_at(types_bytes, at + 4)?,
                            bit_offset: if kind_flag { off & 0xff_ffff } else { off },
                        });
                    }
                    12 * vlen
                }
                6 => 8 * vlen,        // ENUM
                13 => 8 * vlen,       // FUNC_PROTO
                15 | 19 => 12 * vlen, // DATASEC, ENUM64
                _ => 0,
            };
            p += extra;
            if p > types_bytes.len() {
                return Err(BtfError::Truncated);
            }
            types.push(Type {
                name: name_off,
                kind,
                ty: size_or_type,
                members,
            });
        }
        Ok(Btf { types, strings })
    }

    fn str(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.ty
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// Byte offset of `member` in `struct name`, looking into anonymous structs and unions.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        // Structs with members win over declarations (a forward declaration has none).
        let t = self
            .types
            .iter()
            .find(|t| t.kind == KIND_STRUCT && !t.members.is_empty() && self.str(t.name) == name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        self.find(t, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoMember(name.to_owned(), member.to_owned()))
    }

    fn find(&self, t: &Type, member: &str, depth: u32) -> Option<u32> {
        if depth > 8 {
            return None;
        }
        for m in &t.members {
            if m.name != 0 && self.str(m.name) == member {
                return Some(m.bit_offset);
            }
        }
        for m in t.members.iter().filter(|m| m.name == 0) {
            if let Some(inner) = self.resolve(m.ty)
                && matches!(inner.kind, KIND_STRUCT | KIND_UNION)
                && let Some(off) = self.find(inner, member, depth + 1)
            {
                return Some(m.bit_offset + off);
            }
        }
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A BTF blob builder for tests: strings and types, in the kernel's encoding.
    pub struct Builder {
        strings: Vec<u8>,
        types: Vec<u8>,
        str_base: u32,
    }

    impl Builder {
        pub fn new(str_base: u32) -> Self {
            Builder {
                strings: if str_base == 0 { vec![0] } else { Vec::new() },
                types: Vec::new(),
                str_base,
            }
        }

        pub fn s(&mut self, s: &str) -> u32 {
            let off = self.str_base + self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn word(&mut self, w: u32) {
            self.types.extend_from_slice(&w.to_le_bytes());
        }

        pub fn int(&mut self) {
            let n = self.s("int");
            for w in [n, 1 << 24, 4, 32] {
                self.word(w);
            }
        }

        /// `(name, type id, bit offset)` members; `union` picks kind UNION.
        pub fn record(&mut self, name: &str, union: bool, members: &[(&str, u32, u32)]) {
            let n = if name.is_empty() { 0 } else { self.s(name) };
            let kind = if union { KIND_UNION } else { KIND_STRUCT };
            self.word(n);
            self.word((kind << 24) | members.len() as u32);
            self.word(64);
            for &(m, ty, off) in members {
                let mn = if m.is_empty() { 0 } else { self.s(m) };
                self.word(mn);
                self.word(ty);
                self.word(off);
            }
        }

        pub fn build(&self) -> Vec<u8> {
            let mut d = vec![0x9f, 0xeb, 1, 0];
            d.extend_from_slice(&24u32.to_le_bytes());
            d.extend_from_slice(&0u32.to_le_bytes());
            d.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            d.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            d.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
            d.extend_from_slice(&self.types);
            d.extend_from_slice(&self.strings);
            d
        }
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let mut b = Builder::new(0);
        b.int(); // id 1
        b.record("", true, &[("f_op", 1, 0), ("f_x", 1, 0)]); // id 2: anonymous union
        b.record(
            "file",
            false,
            &[("f_mode", 1, 0), ("", 2, 64), ("private_data", 1, 1600)],
        );
        let btf = Btf::parse(&b.build(), None).unwrap();
        assert_eq!(btf.member_offset("file", "private_data"), Ok(200));
        assert_eq!(btf.member_offset("file", "f_x"), Ok(8));
        assert_eq!(
            btf.member_offset("file", "nope"),
            Err(BtfError::NoMember("file".into(), "nope".into()))
        );
        assert_eq!(
            btf.member_offset("inode", "i_mode"),
            Err(BtfError::NoStruct("inode".into()))
        );
    }

    #[test]
    fn split_btf_continues_the_base() {
        let mut b = Builder::new(0);
        b.int();
        b.record("ib_uobject", false, &[("user_handle", 1, 0)]);
        let base_blob = b.build();
        let base_strings = {
            let base = Btf::parse(&base_blob, None).unwrap();
            base.strings.len() as u32
        };
        let mut m = Builder::new(base_strings);
        // Member type 2 (ib_uobject) lives in the base.
        m.record(
            "ib_uverbs_completion_event_file",
            false,
            &[("uobj", 2, 0), ("ev_queue", 1, 160 * 8)],
        );
        let base = Btf::parse(&base_blob, None).unwrap();
        let split = Btf::parse(&m.build(), Some(base)).unwrap();
        assert_eq!(
            split.member_offset("ib_uverbs_completion_event_file", "ev_queue"),
            Ok(160)
        );
        assert_eq!(split.member_offset("ib_uobject", "user_handle"), Ok(0));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(Btf::parse(b"nope", None).err(), Some(BtfError::Header));
        let mut b = Builder::new(0);
        b.record("s", false, &[("a", 0, 0)]);
        let mut d = b.build();
        d.truncate(d.len() - 10);
        assert!(Btf::parse(&d, None).is_err());
    }
}
