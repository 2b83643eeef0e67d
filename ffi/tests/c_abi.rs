//! The C ABI from C: the programs under `tests/c/` include `ffi/include/nccl.h`, link
//! `-lnccl` against this crate's library installed as `libnccl.so.2`, fork ranks that pass the
//! unique id through pipes, and check every collective, grouped send/recv, split, abort and
//! the error codes (`extension.c`: topoccl.h's work handles, tags and receives from any
//! source). Also: the library exports exactly the header's functions (NCCL 2.30.7's list), and
//! topoccl.h's extension.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

mod common;
use common::{built_library, repo};

/// The tests run in parallel and share one directory, so the library is installed and each
/// program compiled exactly once: rewriting a file that a running test program has mapped
/// would crash that program.
static BUILT: Mutex<Option<Built>> = Mutex::new(None);

struct Built {
    dir: Option<PathBuf>,
    programs: HashMap<String, PathBuf>,
}

/// The installed library's directory and `program` compiled against it; `None` (after saying
/// why) where this machine cannot build C.
fn program(name: &str) -> Option<PathBuf> {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(|| Built { dir: install(), programs: HashMap::new() });
    let dir = built.dir.clone()?;
    Some(built.programs.entry(name.to_string()).or_insert_with(|| compile(&dir, name)).clone())
}

/// A directory holding the library as NCCL installs it: `libnccl.so.2`, and `libnccl.so`
/// pointing at it (for `-lnccl`).
fn install() -> Option<PathBuf> {
    let Some(lib) = built_library() else {
        // Cargo builds the cdylib with the crate's tests; CI must never skip silently.
        assert!(std::env::var_os("CI").is_none(), "libnccl.so was not built next to the test");
        eprintln!("skipped: libnccl.so was not built next to {:?}", std::env::current_exe());
        return None;
    };
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (`cc`) on this machine");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("topoccl-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::copy(&lib, dir.join("libnccl.so.2")).ok()?;
    let _ = std::fs::remove_file(dir.join("libnccl.so"));
    std::os::unix::fs::symlink("libnccl.so.2", dir.join("libnccl.so")).ok()?;
    Some(dir)
}

fn compile(dir: &Path, program: &str) -> PathBuf {
    compile_against(dir, program, &[repo().join("ffi/include")], program)
}

/// `program` compiled with `includes` (the first holds the `nccl.h` it is built against) into
/// `dir/name`, linked with our library.
fn compile_against(dir: &Path, program: &str, includes: &[PathBuf], name: &str) -> PathBuf {
    let src = repo().join("tests/c").join(format!("{program}.c"));
    let out = dir.join(name);
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"]);
    for i in includes {
        cmd.arg("-I").arg(i);
    }
    let status = cmd
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(dir)
        .arg("-lnccl")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-lpthread")
        .status()
        .unwrap();
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// Runs a test program; its standard output and error, and whether it succeeded.
fn run_with(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String, bool) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("TOPOCCL_TIMEOUT", "30")
        .env("TOPOCCL_CACHE_DIR", std::env::temp_dir().join("topoccl-nccl-cache"));
    for var in ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_ALGO", "NCCL_PROTO", "TOPOCCL_ALGO"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    (stdout, stderr, out.status.success())
}

fn run(program: &Path, args: &[&str]) -> String {
    let (stdout, stderr, ok) = run_with(program, args, &[]);
    eprintln!("{stdout}{stderr}");
    assert!(ok, "{} {args:?} failed", program.display());
    stdout
}

#[test]
fn c_programs_run_every_collective_type_and_op() {
    let Some(prog) = program("collectives") else { return };
    for n in ["2", "3"] {
        let out = run(&prog, &[n]);
        assert!(out.contains(&format!("collectives: {n} ranks")), "{out}");
    }
}

#[test]
fn c_programs_use_topoccl_h() {
    let Some(prog) = program("extension") else { return };
    for n in ["2", "4"] {
        let out = run(&prog, &[n]);
        assert!(out.contains(&format!("extension: {n} ranks")), "{out}");
    }
}

#[test]
fn c_programs_split_abort_and_init_every_way() {
    let Some(prog) = program("communicators") else { return };
    let out = run(&prog, &["4"]);
    assert!(out.contains("peer abort") && out.contains("second thread") && out.contains("InitAll"), "{out}");
}

#[test]
fn c_programs_use_the_nccl_2_30_api() {
    let Some(prog) = program("nccl230") else { return };
    for n in ["2", "3"] {
        let out = run(&prog, &[n, "basics"]);
        assert!(out.contains(&format!("nccl230: {n} ranks")), "{out}");
    }
    let out = run(&prog, &["3", "grow"]);
    assert!(out.contains("grow: 3 ranks"), "{out}");
    let (out, err, ok) = run_with(&prog, &["3", "shrink"], &[("TOPOCCL_TIMEOUT", "20")]);
    assert!(ok && out.contains("shrink: 2 survivors"), "{out}{err}");
}

/// NVIDIA's own `nccl.h` 2.30.7, where `ffi/tests/fetch-nvidia-nccl.sh` put it (CI runs it).
fn nvidia_header() -> Option<PathBuf> {
    let dir = std::env::var_os("TOPOCCL_NVIDIA_NCCL_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/nvidia-nccl-2.30.7/include"));
    if dir.join("nccl.h").exists() {
        return Some(dir);
    }
    assert!(std::env::var_os("CI").is_none(), "NVIDIA's nccl.h is missing: CI runs ffi/tests/fetch-nvidia-nccl.sh");
    eprintln!("skipped: NVIDIA's nccl.h 2.30.7 not found (run ffi/tests/fetch-nvidia-nccl.sh)");
    None
}

#[test]
fn programs_built_against_nvidias_2_30_header_run_on_ours() {
    let Some(nvidia) = nvidia_header() else { return };
    let Some(_) = program("nccl230") else { return };
    let dir = BUILT.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|b| b.dir.clone()).unwrap();
    let includes = [nvidia, repo().join("tests/c/cuda_stub")];
    for p in ["nccl230", "collectives"] {
        let prog = compile_against(&dir, p, &includes, &format!("{p}-nvidia-header"));
        let out = run(&prog, &["3"]);
        assert!(out.contains(&format!("{p}: 3 ranks")), "{out}");
    }
}

#[test]
fn nccl_debug_and_algo_variables_are_honoured() {
    let Some(prog) = program("collectives") else { return };
    let debug = [("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,COLL,TUNING"), ("NCCL_ALGO", "Tree")];
    let (out, err, ok) = run_with(&prog, &["2"], &debug);
    assert!(ok, "{err}");
    // host:pid:tid [rank] NCCL INFO ..., as NCCL writes it.
    let coll = out.lines().find(|l| l.contains("NCCL INFO ncclAllReduce: opCount")).unwrap_or_default();
    let head: Vec<&str> = coll.split(' ').next().unwrap_or_default().split(':').collect();
    assert!(head.len() == 3 && head[1].parse::<u32>().is_ok() && head[2].parse::<u32>().is_ok(), "{coll}");
    assert!(coll.contains(" [0] NCCL INFO ") || coll.contains(" [1] NCCL INFO "), "{coll}");
    assert!(out.contains("Init COMPLETE"), "no INIT lines");
    let tuned: Vec<&str> = out.lines().filter(|l| l.contains("NCCL INFO all_reduce ")).collect();
    assert!(!tuned.is_empty() && tuned.iter().all(|l| l.contains(": tree")), "{tuned:?}");
    // TOPOCCL_ALGO wins over NCCL_ALGO.
    let both =
        [("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "TUNING"), ("NCCL_ALGO", "Tree"), ("TOPOCCL_ALGO", "ring")];
    let (out, err, ok) = run_with(&prog, &["2"], &both);
    assert!(ok, "{err}");
    let tuned: Vec<&str> = out.lines().filter(|l| l.contains("NCCL INFO all_reduce ")).collect();
    assert!(!tuned.is_empty() && tuned.iter().all(|l| l.contains(": ring")), "{tuned:?}");
    // Unknown names are errors, said clearly.
    let (_, err, ok) = run_with(&prog, &["2"], &[("NCCL_ALGO", "Rong")]);
    assert!(!ok && err.contains("NCCL_ALGO=Rong"), "{err}");
}

/// Function names declared in the header: lines `<return type>  [p]ncclX(`.
fn header_functions() -> Vec<String> {
    declared_in("nccl.h", &["nccl", "pnccl"])
}

/// The functions `ffi/include/<header>` declares whose names start with one of `prefixes`.
fn declared_in(header: &str, prefixes: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("ffi/include").join(header)).unwrap();
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| ["ncclResult_t ", "const char* ", "void ", "int ", "ncclTeam_t "].iter().any(|t| l.starts_with(t)))
        .filter_map(|l| l.split('(').next()?.split_whitespace().last().map(|s| s.trim_start_matches('*').to_string()))
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect();
    names.sort();
    names
}

/// NCCL 2.30.7's exported functions, as `nm -D --defined-only` lists NVIDIA's libnccl.so.2
/// (from the nvidia-nccl-cu13 2.30.7 wheel): names only.
fn nccl_2_30_exports() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("ffi/tests/nccl-2.30.7.exports")).unwrap();
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

#[test]
fn exported_symbols_are_the_headers_functions() {
    let Some(lib) = built_library() else {
        assert!(std::env::var_os("CI").is_none(), "libnccl.so was not built next to the test");
        eprintln!("skipped: libnccl.so not built");
        return;
    };
    let out = match Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output() {
        Ok(o) if o.status.success() => o,
        _ => {
            eprintln!("skipped: no `nm` on this machine");
            return;
        }
    };
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    exported.sort();
    // topoccl's extension (include/topoccl.h) beside NCCL's own list.
    let (extension, exported): (Vec<String>, Vec<String>) =
        exported.into_iter().partition(|n| n.starts_with("topoccl"));
    assert_eq!(extension, declared_in("topoccl.h", &["topoccl"]), "the extension is topoccl.h's functions");
    assert_eq!(extension.len(), 8);
    let declared = header_functions();
    assert_eq!(exported, declared, "the library exports what the header declares");
    // 82 functions, 82 pnccl twins, and ncclResetDebugInitInternal (no twin).
    assert_eq!(exported.len(), 165);
    assert_eq!(exported, nccl_2_30_exports(), "the export list is NCCL 2.30.7's");
    let soname = Command::new("readelf").arg("-d").arg(&lib).output();
    if let Ok(o) = soname {
        assert!(String::from_utf8_lossy(&o.stdout).contains("[libnccl.so.2]"), "soname");
    }
}
