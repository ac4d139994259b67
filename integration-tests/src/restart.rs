//! Services of a [`Mesh`] restarted behind the same address, as a supervisor restarts a killed
//! process.

use crate::*;

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

    /// Starts `which` (stopped or killed) again with this mesh's configuration on the same
    /// ports: clients' channels reconnect by themselves.
    ///
    /// # Errors
    /// A port stayed taken for 10 s, or the service did not start.
    pub async fn restart(&mut self, which: Service) -> anyhow::Result<()> {
        let svc = self.svc(which);
        let at = Some((svc.addr, svc.admin_addr));
        let restarted = match which {
            Service::Relation => {
                let c = self.relation_config();
                spawn_on(at, |g, a, s| socialgraph_relation::run(c, g, a, s)).await?
            }
            Service::Projection => {
                let c = self.projection_config();
                spawn_on(at, |g, a, s| socialgraph_projection::run(c, g, a, s)).await?
            }
            Service::Counter => {
                let c = self.counter_config();
                spawn_on(at, |g, a, s| socialgraph_counter::run(c, g, a, s)).await?
            }
        };
        *self.svc(which) = restarted;
        Ok(())
    }
}
