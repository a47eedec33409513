//! Where each side of a demo meets its peer, with the side's endpoint options: every demo's
//! `server` takes a [`Server`], its `client` a [`Client`]. `rdma-demo` builds them from its
//! flags (both, with `--loopback`).

use std::net::TcpListener;

use crate::endpoint::EndpointOptions;
use crate::exchange::{self, ConnInfo, ExchangeError, SameRun};

/// The server side: its options, and the listener its client(s) connect to.
#[derive(Clone, Copy, Debug)]
pub struct Server<'a> {
    pub opts: &'a EndpointOptions,
    pub listener: &'a TcpListener,
}

impl Server<'_> {
    /// Accepts a client and swaps connection info with it within the side's timeout
    /// ([`exchange::server_handshake`]); `connect` moves the QP to RTS before the answer.
    pub fn handshake<E: From<ExchangeError>>(
        &self,
        ours: &ConnInfo,
        run: SameRun,
        connect: impl FnOnce(&ConnInfo) -> Result<(), E>,
    ) -> Result<ConnInfo, E> {
        exchange::server_handshake(self.listener, ours, run, self.opts.timeout, connect)
    }
}

/// The client side: its options, and the server's address.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    pub opts: &'a EndpointOptions,
    pub host: &'a str,
    pub port: u16,
}

impl Client<'_> {
    /// Connects to the server and swaps connection info within the side's timeout
    /// ([`exchange::client_handshake`]).
    pub fn handshake(&self, ours: &ConnInfo, run: SameRun) -> Result<ConnInfo, ExchangeError> {
        exchange::client_handshake(self.host, self.port, ours, run, self.opts.timeout)
    }

    /// `host:port`, as errors name the server.
    pub fn server_name(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}
