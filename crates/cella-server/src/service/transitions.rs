//! Every state change of a sandbox, as one table.
//!
//! A sandbox is `provisioning` while it boots, then `running`; it can be `paused` (frozen,
//! memory kept) and, when persistent, `stopped` (processes ended, files kept); it ends
//! `destroyed`, or `error` when it could not start or its processes died. [`TABLE`] lists each
//! [`Event`] with the states it may happen in and the state it leads to; [`check`] is the one
//! place that asks it. A refusal is a [`Refused`], which the API answers with 409 `CONFLICT`
//! and `details.state`.

use cella_store::SandboxRow;
use cella_types::SandboxState::{self, *};

/// Something that changes a sandbox's state (or, for [`Event::Retime`], needs it live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Its boot finished and its init runs.
    Booted,
    /// Its boot failed.
    BootFailed,
    /// Frozen (API or a timer).
    Pause,
    /// Thawed.
    Unpause,
    /// A stopped sandbox boots again on its kept files.
    Restart,
    /// Processes ended, files kept (persistent sandboxes only; that is checked apart).
    Stop,
    /// A new active-session timeout (the state stays).
    Retime,
    /// Destroyed (a destroyed one is answered as it is, before asking).
    Destroy,
    /// Its processes are gone; a persistent sandbox keeps its files (one booting again on its
    /// kept files too).
    LostKept,
    /// Its processes are gone, and it is cleared.
    Lost,
}

impl Event {
    /// The verb of the 409 message: "cannot {verb} a sandbox that is ...".
    pub fn verb(self) -> &'static str {
        match self {
            Event::Booted | Event::BootFailed => "boot",
            Event::Pause => "pause",
            Event::Unpause | Event::Restart => "resume",
            Event::Stop => "stop",
            Event::Retime => "set the timeout of",
            Event::Destroy => "destroy",
            Event::LostKept | Event::Lost => "mark as gone",
        }
    }
}

/// Where each event may happen, and the state it leads to (`None`: the state stays).
pub const TABLE: &[(Event, &[SandboxState], Option<SandboxState>)] = &[
    (Event::Booted, &[Provisioning], Some(Running)),
    (Event::BootFailed, &[Provisioning], Some(Error)),
    (Event::Pause, &[Running], Some(Paused)),
    (Event::Unpause, &[Paused], Some(Running)),
    (Event::Restart, &[Stopped], Some(Provisioning)),
    (Event::Stop, &[Running, Paused], Some(Stopped)),
    (
        Event::Retime,
        &[Provisioning, Running, Paused, Stopped],
        None,
    ),
    (
        Event::Destroy,
        &[Provisioning, Running, Paused, Stopped, Error],
        Some(Destroyed),
    ),
    (
        Event::LostKept,
        &[Provisioning, Running, Paused],
        Some(Stopped),
    ),
    (Event::Lost, &[Provisioning, Running, Paused], Some(Error)),
];

/// An event refused in the state the sandbox is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {} a sandbox that is {}", .event.verb(), .state.as_str())]
pub struct Refused {
    pub event: Event,
    pub state: SandboxState,
}

/// The state `event` leads to from `from`, or why it may not happen.
pub fn check(from: SandboxState, event: Event) -> Result<SandboxState, Refused> {
    TABLE
        .iter()
        .find(|(e, _, _)| *e == event)
        .filter(|(_, froms, _)| froms.contains(&from))
        .map(|(_, _, to)| to.unwrap_or(from))
        .ok_or(Refused { event, state: from })
}

/// [`check`] on a row, and the new state written into it.
pub fn apply(row: &mut SandboxRow, event: Event) -> Result<SandboxState, Refused> {
    let to = check(crate::rows::state_of(row), event)?;
    row.state = to;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [SandboxState; 6] = [Provisioning, Running, Paused, Stopped, Destroyed, Error];
    const EVENTS: [Event; 10] = [
        Event::Booted,
        Event::BootFailed,
        Event::Pause,
        Event::Unpause,
        Event::Restart,
        Event::Stop,
        Event::Retime,
        Event::Destroy,
        Event::LostKept,
        Event::Lost,
    ];

    /// The whole table written out: (event, from) -> to, for every pair that is allowed.
    fn expected(event: Event, from: SandboxState) -> Option<SandboxState> {
        match (event, from) {
            (Event::Booted, Provisioning) => Some(Running),
            (Event::BootFailed, Provisioning) => Some(Error),
            (Event::Pause, Running) => Some(Paused),
            (Event::Unpause, Paused) => Some(Running),
            (Event::Restart, Stopped) => Some(Provisioning),
            (Event::Stop, Running | Paused) => Some(Stopped),
            (Event::Retime, s) if !s.is_terminal() => Some(s),
            (Event::Destroy, s) if s != Destroyed => Some(Destroyed),
            (Event::LostKept, Provisioning | Running | Paused) => Some(Stopped),
            (Event::Lost, Provisioning | Running | Paused) => Some(Error),
            _ => None,
        }
    }

    #[test]
    fn every_pair_is_allowed_or_refused_as_written() {
        let mut allowed = 0;
        for event in EVENTS {
            for from in ALL {
                match (check(from, event), expected(event, from)) {
                    (Ok(to), Some(want)) => {
                        assert_eq!(to, want, "{event:?} from {from:?}");
                        allowed += 1;
                    }
                    (Err(r), None) => assert_eq!(r, Refused { event, state: from }),
                    (got, want) => panic!("{event:?} from {from:?}: got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(allowed, 22);
    }

    #[test]
    fn nothing_leaves_destroyed() {
        for event in EVENTS {
            assert!(check(Destroyed, event).is_err(), "{event:?}");
        }
    }

    #[test]
    fn every_event_is_in_the_table_once() {
        for event in EVENTS {
            assert_eq!(TABLE.iter().filter(|(e, _, _)| *e == event).count(), 1);
        }
    }

    #[test]
    fn refusals_say_what_and_in_which_state() {
        let r = check(Paused, Event::Pause).unwrap_err();
        assert_eq!(r.to_string(), "cannot pause a sandbox that is paused");
        let r = check(Running, Event::Restart).unwrap_err();
        assert_eq!(r.to_string(), "cannot resume a sandbox that is running");
        let r = check(Error, Event::Retime).unwrap_err();
        assert_eq!(
            r.to_string(),
            "cannot set the timeout of a sandbox that is error"
        );
    }
}
