//! The connections to the API server, opened afresh once the client certificate an exec plugin
//! returned changes: a connection keeps the certificate of its handshake, so without this a
//! renewed certificate would not be presented while the first connection lives (client-go closes
//! its connections then too). Requests and watches already running finish on the old ones.
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::client::legacy::{Builder, Client};
use tower::Service;

use crate::tls::PluginIdentity;

pub struct Connections<C, B> {
    builder: Builder,
    connector: C,
    /// Whose changes open new connections; None: the pool lives as long as the client.
    identity: Option<Arc<PluginIdentity>>,
    /// The identity's generation the pool was opened for, and the pool.
    current: Arc<Mutex<(u64, Client<C, B>)>>,
}

impl<C, B> Clone for Connections<C, B>
where
    C: Clone,
{
    fn clone(&self) -> Self {
        Connections {
            builder: self.builder.clone(),
            connector: self.connector.clone(),
            identity: self.identity.clone(),
            current: Arc::clone(&self.current),
        }
    }
}

impl<C, B> Connections<C, B>
where
    Client<C, B>: Clone,
    C: Clone,
{
    pub fn new(builder: Builder, connector: C, identity: Option<Arc<PluginIdentity>>) -> Self
    where
        C: hyper_util::client::legacy::connect::Connect + Send + Sync + 'static,
        B: hyper::body::Body + Send,
        B::Data: Send,
    {
        let generation = identity.as_ref().map_or(0, |i| i.generation());
        let pool = builder.build(connector.clone());
        Connections { builder, connector, identity, current: Arc::new(Mutex::new((generation, pool))) }
    }
}

impl<C, B, R> Service<R> for Connections<C, B>
where
    Client<C, B>: Service<R> + Clone,
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    type Response = <Client<C, B> as Service<R>>::Response;
    type Error = <Client<C, B> as Service<R>>::Error;
    type Future = <Client<C, B> as Service<R>>::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The pool takes every request at once (hyper's own client is always ready).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let generation = self.identity.as_ref().map_or(0, |i| i.generation());
        let mut pool = {
            let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if current.0 != generation {
                *current = (generation, self.builder.build(self.connector.clone()));
            }
            current.1.clone()
        };
        pool.call(request)
    }
}
