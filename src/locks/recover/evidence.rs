//! The evidence [`decide`](super::decide) weighs, gathered from the state directory and this
//! init: when the dead run could have taken its lock (its start, its owner's last sign of life),
//! and whether a run that may be alive could have written the same Who (a record here on a state
//! that may be the same, a tfinit alive on the Who's host, or a live run of this init).

use std::path::Path;

use super::{Effects, Recovery, Window, CLOCK_SKEW};
use crate::locks::book::LiveRun;
use crate::locks::liveness::{last_alive_ms, run_state, Facts, Observer, RunState};
use crate::locks::lockinfo::LockInfo;
use crate::locks::record::{Heartbeat, Owner, Record};
use crate::locks::record_id::RecordId;
use crate::locks::state::{self, StateOf};
use crate::locks::who::who_host;
use crate::mutation::{self, Guard};

/// A tfinit that may be alive (`alive` says so of each heartbeat's incarnation) and runs
/// terraform on the host that lock Who `who` names, other than `me`: its runs lock as that Who
/// whether they have records or not, so such a lock may be one of theirs.
pub fn live_on_host<'a>(
    who: &str,
    me: &Owner,
    beats: impl IntoIterator<Item = &'a Heartbeat>,
    mut alive: impl FnMut(&Heartbeat) -> bool,
) -> Option<String> {
    let host = who_host(who);
    if !mutation::on(Guard::LiveOnHost) {
        return None;
    }
    beats
        .into_iter()
        .filter(|hb| !hb.host.is_empty() && hb.host == host)
        .filter(|hb| !hb.owner.same_incarnation(me))
        .find(|hb| alive(hb))
        .map(|hb| {
            format!(
                "tfinit {} (incarnation {}) may be alive on host {host}, and its runs lock as {who}",
                hb.owner.name,
                hb.owner.incarnation()
            )
        })
}
impl Recovery {
    /// What the state directory proves about when the dead run of `rec` could have taken the
    /// lock `info`, and whether a run that may be alive here would write the same Who.
    pub(super) fn window(
        &self,
        fx: &dyn Effects,
        observer: &mut Observer,
        path: &RecordId,
        rec: &Record,
        info: &LockInfo,
        all: &[(RecordId, Record)],
    ) -> Window {
        let skew = CLOCK_SKEW.as_millis() as u64;
        let mut unread = Vec::new();
        let hb = self.store.read_heartbeat(&rec.owner).unwrap_or_else(|e| {
            unread.push(format!(
                "the heartbeat of owner {} could not be read ({e})",
                rec.owner.name
            ));
            None
        });
        let state = record_state(fx, rec);
        // Another run whose record is here, on a state that may be this one (whatever directory
        // it works in), with the same Who, that may be alive.
        let twin = all
            .iter()
            .filter(|(p, r)| p != path && r.who == info.who)
            .filter(|(_, r)| state::may_share(&state, &record_state(fx, r)))
            .find(|(_, r)| !matches!(self.state_now(fx, observer, r), RunState::Over(_)))
            .map(|(_, r)| format!("{} of {} in {}", r.run_id, r.owner.name, r.workdir));
        let beats = self.store.heartbeats().unwrap_or_else(|e| {
            unread.push(format!(
                "the heartbeats of the tfinits could not be listed ({e})"
            ));
            Vec::new()
        });
        let on_host = live_on_host(&info.who, &self.me, &beats, |hb| {
            let facts = Facts {
                owner: hb.owner.clone(),
                updated_ms: hb.updated_ms,
                ended: None,
                needs_person_by: None,
                ttl: hb.owner_ttl(),
            };
            let kernel = self.kernel(&hb.owner);
            if kernel.is_none() {
                self.read_beat(fx, observer, &hb.owner);
            }
            let verdict = observer.verdict(&hb.owner.key(), fx.now());
            !matches!(
                run_state(&self.me, &facts, kernel, verdict),
                RunState::Over(_)
            )
        });
        // This init's own live runs with the same Who, on a state that may be this one, that
        // started before the lock was created (one that started later cannot hold it).
        let live = || {
            self.live
                .iter()
                .filter(|_| mutation::on(Guard::LiveRuns))
                .filter(|l| l.who == info.who)
                .filter(|l| {
                    info.created_ms
                        .is_none_or(|c| l.started_ms <= c.saturating_add(skew))
                })
                .find(|l| state::may_share(&state, &live_state(fx, l)))
                .map(|l| {
                    format!(
                        "a run of {} in this init, in {} (workspace {})",
                        self.me.name,
                        l.workdir.display(),
                        l.workspace
                    )
                })
        };
        let judged_by = observer.judging_ttl(&rec.owner.key());
        Window {
            not_before_ms: rec.started_ms.saturating_sub(skew),
            not_after_ms: last_alive_ms(&Facts::of(rec), hb.as_ref(), judged_by)
                .saturating_add(skew),
            live_same_who: twin.or(on_host).or_else(live),
            unread: (!unread.is_empty() && mutation::on(Guard::UnansweredRead))
                .then(|| unread.join("; ")),
        }
    }
}

/// The state `rec`'s run locks, as far as its working directory tells now.
fn record_state(fx: &dyn Effects, rec: &Record) -> StateOf {
    if let Some(why) = state::unsure_reason(&rec.subcommand, &rec.argv, &[]) {
        return StateOf::Unsure(why);
    }
    let data_dir = rec.data_dir.as_deref().map(Path::new);
    fx.state(Path::new(&rec.workdir), data_dir, &rec.workspace)
}

/// The state live run `l` locks, as far as its working directory tells now.
fn live_state(fx: &dyn Effects, l: &LiveRun) -> StateOf {
    if let Some(why) = &l.unsure {
        return StateOf::Unsure(why.clone());
    }
    fx.state(&l.workdir, l.data_dir.as_deref(), &l.workspace)
}
