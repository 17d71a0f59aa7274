//! The limits a connection lives under, so that slow or stalled clients cannot hold a
//! server: deadlines on a request's head, its body and every write, a cap on the requests
//! one connection may make, and each connection's [`Activity`], which the accept loop reads
//! to shed the connection that has waited longest on its client when every slot is taken.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How long a server waits on a client, and how much one connection may ask of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head must arrive whole within this, counted from when the connection
    /// waits for it (also between requests on a kept-alive connection).
    pub head: Duration,
    /// A request body (a form POST) must arrive whole within this, counted from its head;
    /// else the answer is 408 and the connection closes.
    pub body: Duration,
    /// A write that moves no byte for this long (an answer the client does not read)
    /// closes the connection.
    pub write: Duration,
    /// Requests answered on one connection; the last answer closes it, so requests
    /// pipelined on one connection make the server do at most this much work.
    pub requests_per_connection: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head: Duration::from_secs(10),
            body: Duration::from_secs(10),
            write: Duration::from_secs(10),
            requests_per_connection: 100,
        }
    }
}

/// What one connection is doing, as the shedding reads it: serving (the server works on a
/// request) or waiting on its client since a time (for a head or a body, or for it to read).
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
}

#[derive(Debug, Clone, Copy)]
struct Phase {
    /// Requests the server is working on (not waiting on the client for).
    serving: u32,
    /// The last time a byte moved or the server finished a request.
    since: Instant,
    /// Bytes the server holds for the connection's requests (a body being read).
    held: usize,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            phase: Mutex::new(Phase {
                serving: 0,
                since: Instant::now(),
                held: 0,
            }),
        }
    }
}

impl Activity {
    fn with<T>(&self, f: impl FnOnce(&mut Phase) -> T) -> T {
        // A panic while holding the lock leaves a consistent Phase (plain fields).
        f(&mut self.phase.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A byte moved to or from the client.
    pub fn progressed(&self) {
        self.with(|p| p.since = Instant::now());
    }

    /// The server works on a request until the guard drops: the connection is then not
    /// waiting on its client and is never shed.
    pub fn serving(self: &Arc<Self>) -> Serving {
        self.with(|p| p.serving += 1);
        Serving(self.clone())
    }

    /// Since when the connection waits on its client; `None` while the server serves it.
    pub fn waiting_since(&self) -> Option<Instant> {
        self.with(|p| (p.serving == 0).then_some(p.since))
    }

    /// The server holds `bytes` for the connection until the guard drops (a body it reads),
    /// so that shedding can free memory, not only a slot.
    pub fn holding(self: &Arc<Self>, bytes: usize) -> Holding {
        self.with(|p| p.held += bytes);
        Holding(self.clone(), bytes)
    }

    /// Whether the server holds bytes for the connection.
    pub fn holds(&self) -> bool {
        self.with(|p| p.held > 0)
    }
}

/// The server holds bytes for the connection while this lives.
#[derive(Debug)]
pub struct Holding(Arc<Activity>, usize);

impl Drop for Holding {
    fn drop(&mut self) {
        let n = self.1;
        self.0.with(|p| p.held = p.held.saturating_sub(n));
    }
}

/// The server works on a request of the connection while this lives.
#[derive(Debug)]
pub struct Serving(Arc<Activity>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.with(|p| {
            p.serving = p.serving.saturating_sub(1);
            p.since = Instant::now();
        });
    }
}

/// A client's socket whose writes fail with `TimedOut` once one has moved no byte for
/// `limit`, and whose every byte moved counts as the connection's progress.
#[derive(Debug)]
pub struct TimedIo<S> {
    inner: S,
    activity: Arc<Activity>,
    limit: Duration,
    /// Armed when a write finds the socket full, disarmed when one moves bytes.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> TimedIo<S> {
    pub fn new(inner: S, activity: Arc<Activity>, limit: Duration) -> TimedIo<S> {
        TimedIo {
            inner,
            activity,
            limit,
            stalled: None,
        }
    }

    /// A write's outcome, failed when it has been pending past the limit.
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                self.activity.progressed();
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client read nothing of the answer for {} s",
                            limit.as_secs_f64()
                        ),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.progressed();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.deadline(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.deadline(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.deadline(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_waits_on_its_client_unless_served() {
        let a = Arc::new(Activity::default());
        let t0 = a.waiting_since().unwrap();
        let serving = a.serving();
        assert_eq!(a.waiting_since(), None);
        a.progressed();
        assert_eq!(a.waiting_since(), None);
        drop(serving);
        assert!(a.waiting_since().unwrap() >= t0);
        assert!(!a.holds());
        let held = a.holding(10);
        assert!(a.holds());
        drop(held);
        assert!(!a.holds());
    }

    #[tokio::test]
    async fn a_write_the_client_never_reads_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        // The other end is accepted and never read.
        let (_unread, _) = listener.accept().await.unwrap();
        let a = Arc::new(Activity::default());
        let limit = Duration::from_millis(200);
        let mut io = TimedIo::new(client, a.clone(), limit);
        let chunk = [0u8; 64 << 10];
        let mut written = 0usize;
        let e = loop {
            let t0 = Instant::now();
            match std::future::poll_fn(|cx| Pin::new(&mut io).poll_write(cx, &chunk)).await {
                Ok(n) => written += n,
                Err(e) => break (e, t0.elapsed()),
            }
            assert!(written < 1 << 30, "the socket took {written} bytes");
        };
        assert_eq!(e.0.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            e.0.to_string(),
            "the client read nothing of the answer for 0.2 s"
        );
        assert!(e.1 >= limit && e.1 < limit * 10, "{:?}", e.1);
        // The bytes that moved counted as progress, the stall did not.
        assert!(a.waiting_since().unwrap().elapsed() >= limit);
    }
}
