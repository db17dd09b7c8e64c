//! A fault-injecting TCP forwarder: listens on one loopback address and
//! forwards each connection to a target the test can switch; switching
//! cuts every open connection, so a client (an Envoy) reconnects to the
//! new target.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Forwarder {
    pub addr: SocketAddr,
    target: Arc<Mutex<String>>,
    /// Bumped on every switch; connections of an older generation end.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(listen_ip: &str, target: &str) -> Forwarder {
        let listener = TcpListener::bind(format!("{listen_ip}:0")).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target.to_string()));
        let (generation, _) = watch::channel(0u64);
        let (t, g) = (target.clone(), generation.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let to = t.lock().unwrap().clone();
                let mut gen = g.subscribe();
                let born = *gen.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(&to).await else { return };
                    let (mut a, mut b) = (client, upstream);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = gen.wait_for(|g| *g != born) => {}
                    }
                });
            }
        });
        Forwarder { addr, target, generation, task }
    }

    /// Forward new connections to `target`, and cut the open ones.
    pub fn switch(&self, target: &str) {
        *self.target.lock().unwrap() = target.to_string();
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
