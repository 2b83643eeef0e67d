//! Reading what `cuModuleLoadData` is given: a cubin (an ELF file for `EM_CUDA`, its kernels
//! the `.text.<name>` sections, its SM in the low byte of `e_flags`) or PTX text (`.version`,
//! `.target sm_XX`, `.entry <name>(`). The stand-in compiles nothing: it needs the names and
//! the target, to refuse what a real driver would refuse.

use crate::sys::{CUresult, CuResult};

/// A module image, as far as the stand-in cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Cubin {
        /// major * 10 + minor.
        sm: u32,
        names: Vec<String>,
    },
    Ptx {
        /// The `.target` (major * 10 + minor).
        target: u32,
        /// `sm_90a`-style architecture-specific target: runs only on exactly that SM.
        arch_specific: bool,
        /// The `.version` (major * 10 + minor).
        isa: u32,
        names: Vec<String>,
    },
}

impl Image {
    pub fn names(&self) -> &[String] {
        match self {
            Image::Cubin { names, .. } | Image::Ptx { names, .. } => names,
        }
    }
}

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const FATBIN_MAGIC: [u8; 4] = 0xba55_ed50u32.to_le_bytes();
/// `EM_CUDA`.
const EM_CUDA: u16 = 190;
const SHT_NOBITS: u32 = 8;
const EHDR_LEN: usize = 64;
const SHDR_LEN: usize = 64;
/// Images larger than this are refused as corrupt.
const MAX_IMAGE: u64 = 1 << 30;

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default())
}

/// Reads the image at `ptr`, whose length is not given: an ELF's length follows from its
/// headers, PTX ends at its NUL.
///
/// # Safety
/// `ptr` must point at a complete cubin, fatbin or NUL-terminated PTX image.
pub unsafe fn read(ptr: *const u8) -> CuResult<Image> {
    if ptr.is_null() {
        return Err(CUresult::INVALID_VALUE);
    }
    let mut magic = [0u8; 4];
    for (i, m) in magic.iter_mut().enumerate() {
        // SAFETY: byte `i` exists: the bytes before it are not NUL, so the image (ELF, fatbin
        // or NUL-terminated PTX) goes on.
        *m = unsafe { *ptr.add(i) };
        if *m == 0 {
            break;
        }
    }
    if magic == ELF_MAGIC {
        // SAFETY: an ELF image starts with its 64-byte header.
        let header = unsafe { std::slice::from_raw_parts(ptr, EHDR_LEN) };
        let shoff = u64_at(header, 40);
        let shnum = u64::from(u16_at(header, 60));
        let table_end = shoff.checked_add(shnum * SHDR_LEN as u64).filter(|&e| e <= MAX_IMAGE);
        let table_end = table_end.ok_or(CUresult::INVALID_IMAGE)?.max(EHDR_LEN as u64);
        // SAFETY: a complete ELF image holds its section header table.
        let with_table = unsafe { std::slice::from_raw_parts(ptr, table_end as usize) };
        let len = elf_len(with_table)?;
        // SAFETY: ... and every section the table describes.
        return parse_elf(unsafe { std::slice::from_raw_parts(ptr, len) });
    }
    if magic == FATBIN_MAGIC {
        return Err(CUresult::INVALID_IMAGE);
    }
    // SAFETY: not ELF or fatbin: the caller promises NUL-terminated PTX.
    let text = unsafe { std::ffi::CStr::from_ptr(ptr.cast()) };
    parse_ptx(&text.to_string_lossy())
}

/// The byte length an ELF image needs: its header, section table and sections.
fn elf_len(b: &[u8]) -> CuResult<usize> {
    let shoff = u64_at(b, 40) as usize;
    let shnum = usize::from(u16_at(b, 60));
    let mut len = b.len().max(EHDR_LEN);
    for i in 0..shnum {
        let sh = &b[shoff + i * SHDR_LEN..][..SHDR_LEN];
        if u32_at(sh, 4) != SHT_NOBITS {
            let end = u64_at(sh, 24).checked_add(u64_at(sh, 32)).filter(|&e| e <= MAX_IMAGE);
            len = len.max(end.ok_or(CUresult::INVALID_IMAGE)? as usize);
        }
    }
    Ok(len)
}

/// The SM of a cubin from `e_flags`: the low byte (CUDA 12's layout), else the next byte.
fn cubin_sm(e_flags: u32) -> Option<u32> {
    [e_flags & 0xff, (e_flags >> 8) & 0xff].into_iter().find(|sm| (20..=255).contains(sm))
}

/// Parses a complete cubin.
pub fn parse_elf(b: &[u8]) -> CuResult<Image> {
    let bad = CUresult::INVALID_IMAGE;
    if b.len() < EHDR_LEN || b[0..4] != ELF_MAGIC || b[4] != 2 || b[5] != 1 {
        return Err(bad);
    }
    if u16_at(b, 18) != EM_CUDA || usize::from(u16_at(b, 58)) != SHDR_LEN {
        return Err(bad);
    }
    let sm = cubin_sm(u32_at(b, 48)).ok_or(bad)?;
    let (shoff, shnum, shstrndx) = (u64_at(b, 40) as usize, usize::from(u16_at(b, 60)), usize::from(u16_at(b, 62)));
    let slice = |start: usize, len: usize| b.get(start..start.checked_add(len)?);
    let section = |i: usize| slice(i.checked_mul(SHDR_LEN)?.checked_add(shoff)?, SHDR_LEN);
    let strtab = section(shstrndx).ok_or(bad)?;
    let strings = slice(u64_at(strtab, 24) as usize, u64_at(strtab, 32) as usize).ok_or(bad)?;
    let mut names = Vec::new();
    for i in 0..shnum {
        let sh = section(i).ok_or(bad)?;
        let at = u32_at(sh, 0) as usize;
        let name = strings.get(at..).ok_or(bad)?;
        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
        if let Some(kernel) = name.strip_prefix(b".text.") {
            names.push(String::from_utf8_lossy(kernel).into_owned());
        }
    }
    Ok(Image::Cubin { sm, names })
}

/// `8.8` → 88.
fn version(s: &str) -> Option<u32> {
    let (major, minor) = s.split_once('.')?;
    Some(major.parse::<u32>().ok()? * 10 + minor.parse::<u32>().ok()?)
}

/// Parses PTX text.
pub fn parse_ptx(text: &str) -> CuResult<Image> {
    let mut isa = None;
    let mut target = None;
    let mut names = Vec::new();
    let mut tokens = text.split(|c: char| c.is_whitespace() || c == ',').filter(|t| !t.is_empty()).peekable();
    while let Some(t) = tokens.next() {
        match t {
            ".version" if isa.is_none() => isa = tokens.next().and_then(version),
            ".target" if target.is_none() => target = tokens.next().map(str::to_string),
            ".entry" => {
                if let Some(name) = tokens.next().and_then(|n| n.split('(').next()).filter(|n| !n.is_empty()) {
                    names.push(name.to_string());
                }
            }
            _ => {}
        }
    }
    let isa = isa.ok_or(CUresult::INVALID_PTX)?;
    let target = target.ok_or(CUresult::INVALID_PTX)?;
    let arch = target.strip_prefix("sm_").ok_or(CUresult::INVALID_PTX)?;
    let arch_specific = arch.ends_with('a') || arch.ends_with('f');
    let target = arch.trim_end_matches(['a', 'f']).parse::<u32>().map_err(|_| CUresult::INVALID_PTX)?;
    Ok(Image::Ptx { target, arch_specific, isa, names })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_names_target_and_version() {
        let ptx = "//\n.version 8.8\n.target sm_90a\n.address_size 64\n\n\t// .globl\ttopoccl_copy\n\
                   .visible .entry topoccl_copy(\n\t.param .align 8 .b8 topoccl_copy_param_0[48]\n)\n{\n}\n\
                   .visible .entry topoccl_reduce_sum_f32 (\n)\n";
        let img = parse_ptx(ptx).unwrap();
        assert_eq!(
            img,
            Image::Ptx {
                target: 90,
                arch_specific: true,
                isa: 88,
                names: vec!["topoccl_copy".into(), "topoccl_reduce_sum_f32".into()]
            }
        );
        assert_eq!(parse_ptx(".entry x("), Err(CUresult::INVALID_PTX));
        assert_eq!(parse_ptx("garbage"), Err(CUresult::INVALID_PTX));
    }

    #[test]
    fn cubin_sm_layouts() {
        assert_eq!(cubin_sm(0x005a_055a), Some(90));
        assert_eq!(cubin_sm(0x0000_5000), Some(80));
        assert_eq!(cubin_sm(0), None);
    }

    #[test]
    fn truncated_elf_is_refused() {
        let mut b = vec![0u8; 64];
        b[0..4].copy_from_slice(&ELF_MAGIC);
        assert_eq!(parse_elf(&b), Err(CUresult::INVALID_IMAGE));
    }
}
