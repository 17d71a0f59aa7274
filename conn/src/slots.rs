//! The connection cap: a slot per open connection, and at the cap the slot of the connection
//! that has waited longest on its client (idle, a slow head or body, an answer not read) for
//! the new one, so slow clients cannot hold every slot and a new client is served at once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::limits::Activity;

/// At the cap with every connection serving, how often to look again for one to shed.
const SHED_RETRY: Duration = Duration::from_millis(100);

/// One open connection, as the accept loop sees it.
#[derive(Debug, Default)]
pub struct Conn {
    activity: Arc<Activity>,
    /// Told when the accept loop needs this connection's slot.
    shed: Notify,
}

impl Conn {
    /// What the connection is doing (the server marks its requests served on it).
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

#[derive(Debug, Default)]
struct Open {
    conns: Mutex<(u64, HashMap<u64, Arc<Conn>>)>,
}

impl Open {
    fn with<T>(&self, f: impl FnOnce(&mut (u64, HashMap<u64, Arc<Conn>>)) -> T) -> T {
        // The map stays consistent whatever panicked while holding the lock.
        f(&mut self.conns.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Tells the connection that has waited longest on its client, among those `which`
    /// accepts, to close (none while every such connection is serving).
    fn shed_longest_waiting(&self, which: impl Fn(&Conn) -> bool) {
        let oldest = self.with(|(_, map)| {
            map.values()
                .filter(|c| which(c))
                .filter_map(|c| c.activity.waiting_since().map(|t| (t, c.clone())))
                .min_by_key(|(t, _)| *t)
                .map(|(_, c)| c)
        });
        if let Some(c) = oldest {
            c.shed.notify_one();
        }
    }
}

/// The slots of a server's connections.
#[derive(Debug)]
pub struct Slots {
    free: Arc<Semaphore>,
    open: Arc<Open>,
}

/// A connection's slot: it is among the open ones, and holds a slot, while this lives
/// (dropped also when its task panics, so a dead entry is never the one shed).
#[derive(Debug)]
pub struct Slot {
    open: Arc<Open>,
    id: u64,
    conn: Arc<Conn>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The connection in this slot.
    pub fn conn(&self) -> &Conn {
        &self.conn
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Out of the open connections before the permit frees (fields drop after this).
        self.open.with(|(_, map)| map.remove(&self.id));
    }
}

impl Slots {
    /// At most `max` connections at once (at least one).
    pub fn new(max: usize) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(max.max(1))),
            open: Arc::default(),
        }
    }

    /// A slot for a connection just accepted: a free one, else the one of the connection
    /// that has waited longest on its client, told to close. While every connection is
    /// serving, it waits (and further ones wait unaccepted in the kernel's queue).
    pub async fn take(&self) -> Slot {
        let permit = loop {
            if let Ok(p) = self.free.clone().try_acquire_owned() {
                break p;
            }
            self.open.shed_longest_waiting(|_| true);
            tokio::select! {
                p = self.free.clone().acquire_owned() => {
                    // The semaphore is never closed.
                    if let Ok(p) = p { break p }
                }
                _ = tokio::time::sleep(SHED_RETRY) => {}
            }
        };
        let conn = Arc::new(Conn::default());
        let id = self.open.with(|(next, map)| {
            *next += 1;
            map.insert(*next, conn.clone());
            *next
        });
        Slot {
            open: self.open.clone(),
            id,
            conn,
            _permit: permit,
        }
    }
}

impl Slots {
    /// Tells the connection that has waited longest on its client while the server holds
    /// bytes for it (a body it sends slowly or not at all) to close, freeing them.
    pub fn shed_holder(&self) {
        self.open.shed_longest_waiting(|c| c.activity.holds());
    }
}

/// Runs `served` (a connection's work) until it ends or the accept loop sheds the connection
/// while it waits on its client.
pub async fn serve_until_shed<F: Future>(conn: &Conn, served: F) {
    tokio::pin!(served);
    loop {
        tokio::select! {
            // A shed is looked at first, so a connection told to go does not start a request.
            biased;
            () = conn.shed.notified() => {
                // A request the server already works on finishes; the accept loop then
                // looks again.
                if conn.activity.waiting_since().is_some() {
                    return;
                }
            }
            _ = &mut served => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_the_cap_the_connection_waiting_longest_is_shed_and_a_serving_one_is_not() {
        let slots = Slots::new(2);
        let old = slots.take().await;
        let serving = slots.take().await;
        let _busy = serving.conn().activity().serving();
        old.conn().activity().progressed();
        let shed = tokio::spawn(async move {
            serve_until_shed(old.conn(), std::future::pending::<()>()).await;
        });
        let kept = tokio::spawn(async move {
            serve_until_shed(serving.conn(), std::future::pending::<()>()).await;
        });
        // The third connection gets the slot of the one waiting on its client.
        let _new = slots.take().await;
        shed.await.unwrap();
        assert!(!kept.is_finished());
        kept.abort();
    }

    #[tokio::test]
    async fn to_free_memory_the_holder_waiting_longest_is_shed() {
        let slots = Slots::new(4);
        let idle = slots.take().await;
        let holder = slots.take().await;
        let _held = holder.conn().activity().holding(100);
        holder.conn().activity().progressed();
        let idle = tokio::spawn(async move {
            serve_until_shed(idle.conn(), std::future::pending::<()>()).await;
        });
        let holder = tokio::spawn(async move {
            serve_until_shed(holder.conn(), std::future::pending::<()>()).await;
        });
        // The idle connection waited longer, but holds nothing.
        slots.shed_holder();
        holder.await.unwrap();
        assert!(!idle.is_finished());
        idle.abort();
    }
}
