//! Heartbeats: `POST CELLA_HEARTBEAT_URL` with `Authorization: Bearer <token>` and a
//! [`cella_types::TaskProgress`] body, every interval, from a thread of its own. The server
//! answers 204; 410 once the run is over (the supervisor then stops the agent).
