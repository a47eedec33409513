//! Finding a function in a shared library for a uprobe, honouring symbol versions.
//!
//! libibverbs exports some functions twice, e.g. `ibv_get_cq_event@@IBVERBS_1.1` (the default,
//! what programs link against) and `ibv_get_cq_event@IBVERBS_1.0` (a compatibility alias at
//! another address). aya takes the first name match; we take the default version's offset.

use std::path::Path;

use object::{
    Endianness,
    read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _, Sym as _},
};

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a 64-bit ELF file: {source}")]
    Parse { path: String, source: object::Error },
    #[error("{path} does not define {symbol}")]
    NoSymbol { path: String, symbol: String },
    #[error("{path}: {symbol} at {vaddr:#x} is in no loadable segment")]
    NotLoaded {
        path: String,
        symbol: String,
        vaddr: u64,
    },
}

/// File offset of the default-version definition of function `symbol` in `path`.
pub fn function_offset(path: &Path, symbol: &str) -> Result<u64, ElfError> {
    let p = path.display().to_string();
    let data = std::fs::read(path).map_err(|source| ElfError::Read {
        path: p.clone(),
        source,
    })?;
    let parse = |source| ElfError::Parse {
        path: p.clone(),
        source,
    };
    let file = ElfFile64::<Endianness>::parse(&*data).map_err(parse)?;
    let endian = file.endian();
    let sections = file.elf_section_table();
    let dynsym = sections
        .symbols(endian, &*data, object::elf::SHT_DYNSYM)
        .map_err(parse)?;
    let versions = sections.versions(endian, &*data).map_err(parse)?;
    let mut best: Option<(u64, bool)> = None; // (vaddr, is default version)
    for (index, sym) in dynsym.iter().enumerate() {
        if sym.st_type() != object::elf::STT_FUNC || sym.st_shndx(endian) == object::elf::SHN_UNDEF
        {
            continue;
        }
        if sym.name(endian, dynsym.strings()).ok() != Some(symbol.as_bytes()) {
            continue;
        }
        let default = versions.as_ref().is_none_or(|v| {
            !v.version_index(endian, object::read::SymbolIndex(index))
                .is_hidden()
        });
        if best.is_none_or(|(_, d)| default && !d) {
            best = Some((sym.st_value(endian), default));
        }
    }
    let (vaddr, _) = best.ok_or_else(|| ElfError::NoSymbol {
        path: p.clone(),
        symbol: symbol.to_owned(),
    })?;
    let segments = file
        .elf_header()
        .program_headers(endian, &*data)
        .map_err(parse)?;
    segments
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .find_map(|ph| {
            let start = ph.p_vaddr(endian);
            (start..start + ph.p_filesz(endian))
                .contains(&vaddr)
                .then(|| vaddr - start + ph.p_offset(endian))
        })
        .ok_or(ElfError::NotLoaded {
            path: p,
            symbol: symbol.to_owned(),
            vaddr,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libibverbs (installed by `cargo xtask setup` with libibverbs-dev) has both versions.
    const LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

    #[test]
    fn default_version_of_ibv_get_cq_event_is_chosen() {
        let off = function_offset(Path::new(LIBIBVERBS), "ibv_get_cq_event").expect("resolves");
        // The compat alias ibv_get_cq_event@IBVERBS_1.0 sits elsewhere; aya's first-match pick
        // would be either. Check we got the @@ one: the only one whose name is not hidden.
        let data = std::fs::read(LIBIBVERBS).unwrap();
        let file = ElfFile64::<Endianness>::parse(&*data).unwrap();
        let endian = file.endian();
        let sections = file.elf_section_table();
        let dynsym = sections
            .symbols(endian, &*data, object::elf::SHT_DYNSYM)
            .unwrap();
        let versions = sections
            .versions(endian, &*data)
            .unwrap()
            .expect("versioned library");
        let defs: Vec<(u64, bool)> = dynsym
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.name(endian, dynsym.strings()).ok() == Some(&b"ibv_get_cq_event"[..])
            })
            .map(|(i, s)| {
                (
                    s.st_value(endian),
                    versions
                        .version_index(endian, object::read::SymbolIndex(i))
                        .is_hidden(),
                )
            })
            .collect();
        assert_eq!(defs.len(), 2, "two versions exported: {defs:?}");
        let default = defs.iter().find(|(_, hidden)| !hidden).unwrap().0;
        let compat = defs.iter().find(|(_, hidden)| *hidden).unwrap().0;
        assert_ne!(default, compat);
        // In libibverbs the text segment maps at its file offset.
        assert_eq!(off, default, "default version's offset");
    }

    #[test]
    fn missing_symbol_and_file_are_errors() {
        let e = function_offset(Path::new(LIBIBVERBS), "no_such_function").unwrap_err();
        assert!(
            e.to_string().contains("does not define no_such_function"),
            "{e}"
        );
        let e = function_offset(Path::new("/nonexistent/lib.so"), "x").unwrap_err();
        assert!(
            e.to_string().starts_with("reading /nonexistent/lib.so"),
            "{e}"
        );
        let e = function_offset(Path::new("/proc/self/status"), "x").unwrap_err();
        assert!(e.to_string().contains("not a 64-bit ELF"), "{e}");
    }
}
