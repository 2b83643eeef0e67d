//! [`BuiltSchedules`]: the schedules a [`Selector`](super::Selector) has built, kept in memory,
//! and on disk where they took long to build.
//!
//! A searched generator's schedule (Blink, forest, TACOS) is proven by the verifier before it can
//! touch data, but not before it is priced: pricing builds every candidate, and on a 16-rank
//! cluster proving the deep ones that lose cost seconds. A schedule is therefore kept with
//! whether it has been proven, and [`BuiltSchedules::proven`] proves it on first use.

use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{Collective, Schedule};
use topoccl_synth::topology::Topology;

use super::cache::DiskCache;
use super::{size_bucket, Choice};
use crate::error::{Error, Result};

/// Schedules that took at least this long to build are also kept on disk.
const DISK_SCHEDULE_MIN_SECS: f64 = 0.2;
/// Schedules kept in memory before the map is emptied (size-dependent synthesizers add one per
/// size bucket).
const MEMORY_SCHEDULES: usize = 512;

/// What a built schedule depends on; its text form is the key of the disk cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct ScheduleKey {
    pub algorithm: String,
    pub collective: Collective,
    pub pipeline: u32,
    pub channels: u32,
    /// The size bucket for size-dependent generators, else 0.
    pub sized: u64,
    pub follow_paths: bool,
}

impl std::fmt::Display for ScheduleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/p{}/c{}/{}", self.algorithm, self.collective, self.pipeline, self.channels, self.sized)?;
        if !self.follow_paths {
            f.write_str("/one-path")?;
        }
        Ok(())
    }
}

/// One schedule in memory.
struct Built {
    schedule: Arc<Schedule>,
    /// Proven by the verifier, or needing no proof (a construction's, or read from the disk
    /// cache, which keeps proven schedules only).
    proven: bool,
    /// How long it took to build: proven schedules that took long go to the disk cache.
    build_secs: f64,
}

/// The schedules of one topology, by [`ScheduleKey`].
pub(super) struct BuiltSchedules {
    fingerprint: u64,
    cache: DiskCache,
    follow_paths: bool,
    kept: FxHashMap<ScheduleKey, Built>,
}

impl BuiltSchedules {
    pub fn new(fingerprint: u64, cache: DiskCache, follow_paths: bool) -> BuiltSchedules {
        BuiltSchedules { fingerprint, cache, follow_paths, kept: FxHashMap::default() }
    }

    /// The key `choice` is kept under for `collective` at `bytes`.
    pub fn key(&self, registry: &Registry, choice: &Choice, collective: Collective, bytes: u64) -> Result<ScheduleKey> {
        let sized = if registry.get(&choice.algorithm)?.size_dependent() { size_bucket(bytes) } else { 0 };
        Ok(ScheduleKey {
            algorithm: choice.algorithm.clone(),
            collective,
            pipeline: choice.pipeline,
            channels: choice.channels,
            sized,
            follow_paths: self.follow_paths,
        })
    }

    /// The schedule `choice` stands for, to be priced: built on first use, then kept; a searched
    /// generator's is not proven here ([`BuiltSchedules::proven`] does that before it runs).
    pub fn priceable(
        &mut self,
        topology: &Topology,
        registry: &Registry,
        choice: &Choice,
        collective: Collective,
        bytes: u64,
    ) -> Result<Arc<Schedule>> {
        let key = self.key(registry, choice, collective, bytes)?;
        self.kept_or_built(topology, registry, choice, &key).map(|b| Arc::clone(&b.schedule))
    }

    /// The schedule `choice` stands for, to be run: built on first use, and proven by the
    /// verifier where a search found it. A synthesizer's bug then costs a candidate, never a
    /// wrong result.
    pub fn proven(
        &mut self,
        topology: &Topology,
        registry: &Registry,
        choice: &Choice,
        collective: Collective,
        bytes: u64,
    ) -> Result<Arc<Schedule>> {
        let key = self.key(registry, choice, collective, bytes)?;
        let built = self.kept_or_built(topology, registry, choice, &key)?;
        let schedule = Arc::clone(&built.schedule);
        if !built.proven {
            topoccl_synth::verify::verify(&schedule)?;
            built.proven = true;
            if built.build_secs >= DISK_SCHEDULE_MIN_SECS {
                self.cache.store_schedule(self.fingerprint, &key.to_string(), &schedule);
            }
        }
        Ok(schedule)
    }

    /// Keeps `schedule`, proven elsewhere (a background selector's), as what `choice` stands
    /// for at `bytes`.
    pub fn keep_proven(
        &mut self,
        registry: &Registry,
        choice: &Choice,
        collective: Collective,
        bytes: u64,
        schedule: Arc<Schedule>,
    ) -> Result<()> {
        let key = self.key(registry, choice, collective, bytes)?;
        if self.kept.len() >= MEMORY_SCHEDULES {
            self.kept.clear();
        }
        self.kept.insert(key, Built { schedule, proven: true, build_secs: 0.0 });
        Ok(())
    }

    /// The kept entry for `key`, built (or read from disk) and kept first if there is none.
    fn kept_or_built(
        &mut self,
        topology: &Topology,
        registry: &Registry,
        choice: &Choice,
        key: &ScheduleKey,
    ) -> Result<&mut Built> {
        if !self.kept.contains_key(key) {
            let built = build(topology, registry, choice, key, self.fingerprint, &self.cache)?;
            if self.kept.len() >= MEMORY_SCHEDULES {
                self.kept.clear();
            }
            self.kept.insert(key.clone(), built);
        }
        self.kept.get_mut(key).ok_or_else(|| Error::Internal(format!("schedule {key} not kept")))
    }

    /// Writes `schedule` into the disk cache under `key` (tests: a misfiled schedule).
    #[cfg(test)]
    pub fn store_on_disk(&self, key: &ScheduleKey, schedule: &Schedule) {
        self.cache.store_schedule(self.fingerprint, &key.to_string(), schedule);
    }
}

/// The schedule `key` names, read from the disk cache or generated.
fn build(
    topology: &Topology,
    registry: &Registry,
    choice: &Choice,
    key: &ScheduleKey,
    fingerprint: u64,
    cache: &DiskCache,
) -> Result<Built> {
    let generator = registry.get(&choice.algorithm)?;
    let collective = key.collective;
    // A cached schedule was proven when it was made (by this version: the cache checks), and
    // the cache reads only files of this user that no one else can write; what is checked again
    // is what a mix-up of files would break: the collective and the ranks.
    let cached = cache
        .schedule(fingerprint, &key.to_string())
        .filter(|s| s.collective == collective && s.nranks as usize == topology.nranks());
    if let Some(s) = cached {
        return Ok(Built { schedule: Arc::new(s), proven: true, build_secs: 0.0 });
    }
    let started = Instant::now();
    let request = choice.request(topology, collective, key.sized).follow_paths(key.follow_paths);
    let schedule = registry.generate(&choice.algorithm, &request)?;
    let build_secs = started.elapsed().as_secs_f64();
    let proven = !generator.searched();
    if proven && build_secs >= DISK_SCHEDULE_MIN_SECS {
        cache.store_schedule(fingerprint, &key.to_string(), &schedule);
    }
    Ok(Built { schedule: Arc::new(schedule), proven, build_secs })
}
