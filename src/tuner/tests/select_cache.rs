//! The selector with its disk cache: what another build, another run or a broken disk left
//! there never fails a job nor changes what runs.

use super::super::built::ScheduleKey;
use super::*;
use topoccl_synth::topology::resolve;

#[test]
fn a_schedule_filed_under_another_collective_is_ignored() {
    let dir = std::env::temp_dir().join(format!("topoccl-misfiled-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut s =
        Selector::new(resolve("ring:4").unwrap(), SelectorOptions { cache: DiskCache::at(&dir), ..Default::default() })
            .unwrap();
    let choice = Choice::new("ring", 1, 0);
    let key = ScheduleKey {
        algorithm: "ring".into(),
        collective: Collective::ReduceScatter,
        pipeline: choice.pipeline,
        channels: choice.channels,
        sized: 0,
        follow_paths: s.options.sim.follow_paths,
    };
    let mut gather = Registry::builtin()
        .generate("ring", &topoccl_synth::generate::Request::new(&s.topology, Collective::AllGather))
        .unwrap();
    gather.name = "misfiled".into();
    s.schedules.store_on_disk(&key, &gather);
    let got = s.schedule(&choice, Collective::ReduceScatter, 4096).unwrap();
    assert_eq!(got.collective, Collective::ReduceScatter);
    assert_ne!(got.name, "misfiled");
    topoccl_synth::verify::verify(&got).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_decision_naming_an_unknown_algorithm_is_decided_again() {
    let dir = std::env::temp_dir().join(format!("topoccl-selector-unknown-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = || SelectorOptions { cache: DiskCache::at(&dir), ..Default::default() };
    let topology = resolve("dgx1").unwrap();
    let key = DecisionKey::new(None, Collective::AllReduce, 1 << 24, &SimConfig::default());
    // What another build with the same version string could have written.
    DiskCache::at(&dir).store_decision(topology.fingerprint(), &key.to_string(), &Choice::new("warp-drive", 1, 0));
    let mut s = Selector::new(topology, opts()).unwrap();
    let c = s.choose(Collective::AllReduce, 1 << 24).expect("decided again, not failed");
    assert_ne!(c.algorithm, "warp-drive");
    assert!(Registry::builtin().get(&c.algorithm).is_ok(), "{c}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn decisions_survive_in_the_disk_cache() {
    let dir = std::env::temp_dir().join(format!("topoccl-selector-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = || SelectorOptions { cache: DiskCache::at(&dir), ..Default::default() };
    let mut a = Selector::new(resolve("dgx1").unwrap(), opts()).unwrap();
    let c = a.choose(Collective::AllReduce, 1 << 24).unwrap();
    let mut b = Selector::new(resolve("dgx1").unwrap(), opts()).unwrap();
    assert_eq!(b.stored.values().next(), Some(&c));
    assert_eq!(b.choose(Collective::AllReduce, 1 << 24).unwrap(), c);
    assert_eq!(b.decisions.values().next(), Some(&c));
    // The disk keys are the text forms of the typed keys, unchanged from earlier versions.
    let key = DecisionKey::new(None, Collective::AllReduce, 1 << 24, &SimConfig::default());
    assert_eq!(key.to_string(), "auto/all_reduce/16777216/0/0/None/false/None/true");
    let key = ScheduleKey {
        algorithm: "ring".into(),
        collective: Collective::Broadcast { root: 2 },
        pipeline: 4,
        channels: 0,
        sized: 0,
        follow_paths: false,
    };
    assert_eq!(key.to_string(), "ring/broadcast(root 2)/p4/c0/0/one-path");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_schedule_filed_for_another_rank_count_is_ignored() {
    let dir = std::env::temp_dir().join(format!("topoccl-foreign-ranks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut s =
        Selector::new(resolve("ring:4").unwrap(), SelectorOptions { cache: DiskCache::at(&dir), ..Default::default() })
            .unwrap();
    let choice = Choice::new("ring", 1, 0);
    let key = s.schedules.key(&s.registry, &choice, Collective::AllGather, 4096).unwrap();
    let eight = resolve("ring:8").unwrap();
    let foreign = Registry::builtin()
        .generate("ring", &topoccl_synth::generate::Request::new(&eight, Collective::AllGather))
        .unwrap();
    s.schedules.store_on_disk(&key, &foreign);
    let got = s.schedule(&choice, Collective::AllGather, 4096).unwrap();
    assert_eq!(got.nranks, 4);
    topoccl_synth::verify::verify(&got).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_or_read_only_cache_directory_costs_only_the_cache() {
    use nix::mount::{mount, umount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let none = None::<&str>;
    // This thread's own mount namespace, with a tiny file system: root only (CI runs as root).
    let private = unshare(CloneFlags::CLONE_NEWNS)
        .and_then(|()| mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none));
    if let Err(e) = private {
        eprintln!("skipped: no mount namespace of its own here ({e}; needs root)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("topoccl-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    mount(Some("tmpfs"), &dir, Some("tmpfs"), MsFlags::empty(), Some("size=16k,mode=0700")).unwrap();
    // Full: what is left of 16 KiB after a file as large as it lets be.
    let _ = std::fs::write(dir.join("filler"), vec![0u8; 64 << 10]);
    let opts = || SelectorOptions { cache: DiskCache::at(&dir), ..Default::default() };
    let mut s = Selector::new(resolve("dgx1[0,1,2,3]").unwrap(), opts()).unwrap();
    let c = s.choose(Collective::AllReduce, 1 << 20).expect("decided without a cache");
    topoccl_synth::verify::verify(&s.schedule(&c, Collective::AllReduce, 1 << 20).unwrap()).unwrap();
    let names = || -> Vec<String> {
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    };
    assert!(names().iter().all(|n| !n.contains(".tmp")), "a failed write left {:?}", names());
    // Read-only.
    mount(none, &dir, none, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, none).unwrap();
    let mut s = Selector::new(resolve("dgx1[0,1,2,3]").unwrap(), opts()).unwrap();
    let c = s.choose(Collective::AllGather, 1 << 24).expect("decided without a cache");
    topoccl_synth::verify::verify(&s.schedule(&c, Collective::AllGather, 1 << 24).unwrap()).unwrap();
    umount(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
