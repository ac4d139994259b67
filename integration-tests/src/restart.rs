//! Services restarted behind the same address, as a supervisor restarts a killed process.

use crate::*;

/// Replaces `svc` (stopped or killed) by a service started by `start` on the same ports, as a
/// restarted process behind the same address: clients' channels reconnect by themselves.
///
/// # Errors
/// A port stayed taken for 10 s, or the service did not start.
pub async fn restart_on_same_ports(svc: &mut Svc, start: Restart) -> anyhow::Result<()> {
    let at = Some((svc.addr, svc.admin_addr));
    *svc = match start {
        Restart::Relation(c) => spawn_on(at, |g, a, s| socialgraph_relation::run(*c, g, a, s)).await?,
        Restart::Projection(c) => spawn_on(at, |g, a, s| socialgraph_projection::run(*c, g, a, s)).await?,
        Restart::Counter(c) => spawn_on(at, |g, a, s| socialgraph_counter::run(*c, g, a, s)).await?,
    };
    Ok(())
}

/// Which service [`restart_on_same_ports`] starts, with its configuration.
pub enum Restart {
    /// relation-svc.
    Relation(Box<RelationConfig>),
    /// projection-svc.
    Projection(Box<ProjectionConfig>),
    /// counter-svc.
    Counter(Box<CounterConfig>),
}

/// A service of a [`Mesh`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// relation-svc.
    Relation,
    /// projection-svc.
    Projection,
    /// counter-svc.
    Counter,
}

impl Mesh {
    /// The service `which` of this mesh.
    pub fn svc(&mut self, which: Service) -> &mut Svc {
        match which {
            Service::Relation => &mut self.relation,
            Service::Projection => &mut self.projection,
            Service::Counter => &mut self.counter,
        }
    }

    /// Starts `which` (stopped or killed) again with this mesh's configuration on its ports.
    ///
    /// # Errors
    /// A port stayed taken, or the service did not start.
    pub async fn restart(&mut self, which: Service) -> anyhow::Result<()> {
        let start = match which {
            Service::Relation => Restart::Relation(Box::new(self.relation_config())),
            Service::Projection => Restart::Projection(Box::new(self.projection_config())),
            Service::Counter => Restart::Counter(Box::new(self.counter_config())),
        };
        restart_on_same_ports(self.svc(which), start).await
    }
}
