//! Generators by name: [`Registry::builtin`] has every generator shipped — the classic
//! constructions, Blink, forest packing and TACOS — and a user may add one of their own
//! ([`Registry::register`], checked against [`GENERATOR_API_VERSION`]).

use crate::error::{Error, Result};
use crate::generate::{unsupported, Request, ScheduleGenerator, GENERATOR_API_VERSION};
use crate::schedule::Schedule;

/// Named generators.
pub struct Registry {
    generators: Vec<Box<dyn ScheduleGenerator>>,
}

impl Registry {
    /// The generators shipped with topoccl.
    pub fn builtin() -> Registry {
        Registry {
            generators: vec![
                Box::new(crate::algorithms::ring::Ring),
                Box::new(crate::algorithms::tree::DoubleBinaryTree),
                Box::new(crate::algorithms::rhd::RecursiveHalvingDoubling),
                Box::new(crate::algorithms::rd::RecursiveDoubling),
                Box::new(crate::algorithms::hierarchical::Hierarchical { halving_doubling: false }),
                Box::new(crate::algorithms::hierarchical::Hierarchical { halving_doubling: true }),
                Box::new(crate::algorithms::alltoall::PairwiseAllToAll),
                Box::new(crate::blink::Blink),
                Box::new(crate::forest::Forest),
                Box::new(crate::tacos::Tacos),
            ],
        }
    }

    /// Adds (or replaces, by name) a generator, refused if written for another interface
    /// version.
    pub fn register(&mut self, generator: Box<dyn ScheduleGenerator>) -> Result<()> {
        if generator.api_version() != GENERATOR_API_VERSION {
            return Err(Error::Unsupported {
                algorithm: generator.name().into(),
                collective: "any collective".into(),
                reason: format!(
                    "written for generator API v{}, topoccl-synth speaks v{GENERATOR_API_VERSION}",
                    generator.api_version()
                ),
            });
        }
        self.generators.retain(|g| g.name() != generator.name());
        self.generators.push(generator);
        Ok(())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.generators.iter().map(|g| g.name()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn ScheduleGenerator> {
        self.generators.iter().map(|g| g.as_ref())
    }

    pub fn get(&self, name: &str) -> Result<&dyn ScheduleGenerator> {
        self.iter()
            .find(|g| g.name() == name)
            .ok_or_else(|| Error::UnknownAlgorithm(name.to_string(), self.names().join(", ")))
    }

    /// Generates with the named algorithm, checking that it supports the collective.
    pub fn generate(&self, name: &str, request: &Request) -> Result<Schedule> {
        let g = self.get(name)?;
        if !g.supports(request.collective) {
            return Err(unsupported(g.name(), request.collective, "not implemented by this algorithm"));
        }
        request
            .collective
            .check_root(request.topology.nranks())
            .map_err(|why| unsupported(g.name(), request.collective, &why))?;
        g.generate(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Collective;
    use crate::topology::resolve;

    #[test]
    fn a_root_outside_the_topology_is_refused_by_every_generator() {
        let t = resolve("ring:4").unwrap();
        let reg = Registry::builtin();
        for c in [Collective::Broadcast { root: 4 }, Collective::Reduce { root: 7 }] {
            for g in reg.iter().filter(|g| g.supports(c)) {
                assert!(reg.generate(g.name(), &Request::new(&t, c)).is_err(), "{}", g.name());
            }
        }
    }

    #[test]
    fn a_generator_for_another_interface_version_is_refused() {
        struct Future;
        impl ScheduleGenerator for Future {
            fn api_version(&self) -> u32 {
                GENERATOR_API_VERSION + 1
            }
            fn name(&self) -> &'static str {
                "future"
            }
            fn describe(&self) -> &'static str {
                "written for a later interface"
            }
            fn supports(&self, _: Collective) -> bool {
                true
            }
            fn generate(&self, request: &Request) -> Result<Schedule> {
                Registry::builtin().generate("ring", request)
            }
        }
        let mut reg = Registry::builtin();
        let e = reg.register(Box::new(Future)).unwrap_err().to_string();
        assert!(e.contains("generator API v3"), "{e}");
        assert!(reg.get("future").is_err());
    }

    #[test]
    fn registry_knows_its_generators() {
        let reg = Registry::builtin();
        assert!(reg.get("ring").is_ok());
        let err = reg.get("nope").err().unwrap().to_string();
        assert!(err.contains("ring") && err.contains("tree"), "{err}");
    }
}
