//! libibverbs opened at run time: `dlopen` of the first library that loads, then the symbols
//! the transport calls, by name (NCCL's `ibvwrap`). Nothing links to libibverbs, so a build
//! needs no rdma-core and a machine without it falls back to TCP.
//!
//! `ibv_poll_cq`, `ibv_post_send` and `ibv_post_recv` are inline functions in `verbs.h`: they
//! are called through the context's `ops` table ([`super::device`]), not looked up here. On
//! the real library `dlsym` answers with each symbol's default version (`IBVERBS_1.1`).

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use super::sys::*;

/// The libraries tried when the user names none (NCCL's order, soname first).
pub const DEFAULT_LIBRARIES: [&str; 2] = ["libibverbs.so.1", "libibverbs.so"];

/// The entry points the transport uses.
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    /// `ibv_reg_dmabuf_mr` (rdma-core 34 and later): device memory registered through a
    /// dma-buf descriptor. Optional: without it, device memory is staged through host memory.
    pub reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// The library that answered (the name it was opened by).
    pub path: String,
    /// Kept loaded for the process, as NCCL keeps it: the pointers above point into it.
    _library: Library,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded as long as
// it does; libibverbs' entry points may be called from any thread.
unsafe impl Send for Verbs {}
// SAFETY: as above; nothing in the table is mutated after loading.
unsafe impl Sync for Verbs {}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").field("path", &self.path).field("dmabuf", &self.reg_dmabuf_mr.is_some()).finish()
    }
}

/// The candidates, in order: the user's (`TOPOCCL_IBVERBS_LIB`, `NCCL_IBVERBS_LIB`, as the
/// caller read them) alone if given, else [`DEFAULT_LIBRARIES`].
pub fn candidates(user: Option<&str>) -> Vec<String> {
    match user.map(str::trim).filter(|s| !s.is_empty()) {
        Some(u) => vec![u.to_string()],
        None => DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect(),
    }
}

/// Opens the first of `names` that loads and binds its symbols; why not otherwise (every
/// library tried, and what each lacked or why it did not load).
pub fn open(names: &[String]) -> Result<Verbs, String> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading runs the library's initialisers; libibverbs' (and the stand-in's) set
        // up nothing that touches this process's state (NCCL loads it the same way).
        match unsafe { Library::new(name) } {
            Ok(library) => {
                // SAFETY: each name is looked up with the signature verbs.h gives it.
                let lookup = |symbol: &str| unsafe { library.get::<*mut c_void>(symbol).ok().map(|s| *s) };
                return match bind(&lookup) {
                    Ok(table) => Ok(table.finish(name.clone(), library)),
                    Err(missing) => Err(format!("{name} has no {missing}")),
                };
            }
            // libloading's message is "dlopen failed"; dlerror's words are its source.
            Err(e) => tried.push(std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())),
        }
    }
    Err(format!("cannot load {}: {}", names.join(" or "), tried.join("; ")))
}

/// The symbols, found but not yet tied to their library.
struct Bound {
    symbols: [*mut c_void; REQUIRED.len()],
    reg_dmabuf_mr: *mut c_void,
}

/// The entry points without which there is no transport, in [`Verbs`]' field order.
const REQUIRED: [&str; 17] = [
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_dereg_mr",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_destroy_qp",
];

/// Looks up every symbol through `lookup`; the first required one missing, by name.
fn bind(lookup: &dyn Fn(&str) -> Option<*mut c_void>) -> Result<Bound, &'static str> {
    let mut symbols = [std::ptr::null_mut(); REQUIRED.len()];
    for (slot, name) in symbols.iter_mut().zip(REQUIRED) {
        *slot = lookup(name).filter(|p| !p.is_null()).ok_or(name)?;
    }
    Ok(Bound { symbols, reg_dmabuf_mr: lookup("ibv_reg_dmabuf_mr").unwrap_or(std::ptr::null_mut()) })
}

impl Bound {
    fn finish(self, path: String, library: Library) -> Verbs {
        let s = &self.symbols;
        // SAFETY: each pointer is the non-null address of the exported function of that name,
        // and each field's type is that function's signature in verbs.h (rdma-core 44); the
        // library stays loaded inside the table.
        unsafe {
            use function as f;
            Verbs {
                get_device_list: f(s[0]),
                free_device_list: f(s[1]),
                get_device_name: f(s[2]),
                open_device: f(s[3]),
                close_device: f(s[4]),
                query_device: f(s[5]),
                query_port: f(s[6]),
                query_gid: f(s[7]),
                alloc_pd: f(s[8]),
                dealloc_pd: f(s[9]),
                reg_mr: f(s[10]),
                dereg_mr: f(s[11]),
                create_cq: f(s[12]),
                destroy_cq: f(s[13]),
                create_qp: f(s[14]),
                modify_qp: f(s[15]),
                destroy_qp: f(s[16]),
                reg_dmabuf_mr: (!self.reg_dmabuf_mr.is_null()).then(|| f(self.reg_dmabuf_mr)),
                path,
                _library: library,
            }
        }
    }
}

/// The function a symbol's address is, as the function-pointer type `F`.
///
/// # Safety
/// `F` must be a function-pointer type, the signature of the function at `p`.
unsafe fn function<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the type.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_required_symbol_is_named_and_a_missing_optional_one_is_not_needed() {
        let present = |except: &'static str| move |name: &str| (name != except).then_some(1usize as *mut c_void);
        assert_eq!(bind(&present("ibv_modify_qp")).err(), Some("ibv_modify_qp"));
        let b = bind(&present("ibv_reg_dmabuf_mr")).expect("optional symbol");
        assert!(b.reg_dmabuf_mr.is_null());
        assert!(!bind(&present("nothing")).expect("all").reg_dmabuf_mr.is_null());
    }

    #[test]
    fn libraries_that_do_not_load_or_lack_symbols_are_reported() {
        let e = open(&["/nonexistent/libibverbs.so.1".to_string()]).unwrap_err();
        assert!(e.contains("cannot load /nonexistent/libibverbs.so.1"), "{e}");
        // The C library loads but has no verbs.
        let e = open(&["libc.so.6".to_string()]).unwrap_err();
        assert_eq!(e, "libc.so.6 has no ibv_get_device_list");
        assert_eq!(candidates(Some(" /x/libibverbs.so ")), ["/x/libibverbs.so"]);
        assert_eq!(candidates(None), DEFAULT_LIBRARIES);
    }
}
