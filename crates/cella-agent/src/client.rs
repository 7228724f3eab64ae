//! The node's side of the agent protocol.

use crate::proto::{self, ErrorKind, ExecSpec, ExitInfo, FrameKind, ProtoError, Request, Response};
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// Output of a running command, in the order the agent read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the sandbox agent is not reachable: {0}")]
    Unreachable(std::io::Error),
    #[error("the sandbox agent did not answer in time")]
    Timeout,
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("the sandbox agent refused the request ({kind:?}): {message}")]
    Refused { kind: ErrorKind, message: String },
    #[error("the sandbox agent hung up before the command ended")]
    HungUp,
    #[error("the receiver of the command's output went away")]
    ConsumerGone,
    #[error("the sandbox agent sent an unexpected message")]
    Unexpected,
}

#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
}

impl AgentClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        AgentClient {
            socket: socket.into(),
        }
    }

    async fn connect(&self) -> Result<UnixStream, ClientError> {
        UnixStream::connect(&self.socket)
            .await
            .map_err(ClientError::Unreachable)
    }

    /// Answers the agent's protocol version.
    pub async fn ping(&self, timeout: Duration) -> Result<u32, ClientError> {
        let work = async {
            let mut s = self.connect().await?;
            proto::write_json(&mut s, &Request::Ping).await?;
            match proto::read_frame(&mut s).await? {
                Some((FrameKind::Json, body)) => {
                    match serde_json::from_slice(&body).map_err(ProtoError::from)? {
                        Response::Pong { version } => Ok(version),
                        _ => Err(ClientError::Unexpected),
                    }
                }
                _ => Err(ClientError::Unexpected),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Runs a command and sends its output to `events` as it comes. When the receiver of
    /// `events` is dropped, the connection is closed and the agent kills the command.
    pub async fn exec(
        &self,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, ClientError> {
        let mut s = self.connect().await?;
        proto::write_json(&mut s, &Request::Exec(spec)).await?;
        loop {
            let frame = tokio::select! {
                f = proto::read_frame(&mut s) => f?,
                _ = events.closed() => return Err(ClientError::ConsumerGone),
            };
            match frame {
                None => return Err(ClientError::HungUp),
                Some((FrameKind::Stdout, data)) => {
                    if events.send(ExecEvent::Stdout(data)).await.is_err() {
                        return Err(ClientError::ConsumerGone);
                    }
                }
                Some((FrameKind::Stderr, data)) => {
                    if events.send(ExecEvent::Stderr(data)).await.is_err() {
                        return Err(ClientError::ConsumerGone);
                    }
                }
                Some((FrameKind::Json, body)) => {
                    match serde_json::from_slice(&body).map_err(ProtoError::from)? {
                        Response::Started { .. } => {}
                        Response::Exit(info) => return Ok(info),
                        Response::Error { kind, message } => {
                            return Err(ClientError::Refused { kind, message })
                        }
                        Response::Pong { .. } => return Err(ClientError::Unexpected),
                    }
                }
            }
        }
    }
}
