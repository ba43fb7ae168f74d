//! `llmgw._core.Hold`, `TokenLease`, `Ticket` and `admit`: the limiter's request path.
//!
//! A keyed request takes a unit (rpm), a slot (concurrency) and its token estimate
//! (tpm, budgets) from what its worker holds for its key and its project, and gives
//! the slots and the unused tokens back when it ends. In Python that was two loops
//! over the shares with a dozen attribute reads each, a ticket object and a second
//! pair of loops at the end: under a microsecond with warm caches, several in a busy
//! server whose caches the relay keeps cold. Here each is one call.
//!
//! Only the counters live here. Deciding what to lease, what to give back and when
//! stays in Python (`llmgw.gateway.limits`), which subclasses `Hold` and reads and
//! writes the same fields between requests.

use pyo3::prelude::*;
use pyo3::intern;
use pyo3::types::{PyBool, PyDict, PyTuple};
use smallvec::SmallVec;

/// Tokens leased for one scope: requests take their estimates and settle what they used.
#[pyclass(module = "llmgw._core", name = "TokenLease")]
pub struct TokenLease {
    #[pyo3(get, set)]
    id: i64,
    #[pyo3(get, set)]
    balance: i64,
    #[pyo3(get, set)]
    granted: i64,
    #[pyo3(get, set)]
    until: f64,
    #[pyo3(get, set)]
    in_flight: i64,
}

#[pymethods]
impl TokenLease {
    #[new]
    fn new(lease_id: i64, tokens: i64, until: f64) -> Self {
        Self {
            id: lease_id,
            balance: tokens,
            granted: tokens,
            until,
            in_flight: 0,
        }
    }
}

/// What one worker holds for one scope, as far as a request takes from it.
///
/// Subclassed in Python (`llmgw.gateway.limits.Share`); the constructor ignores its
/// arguments, which are the subclass's.
#[pyclass(module = "llmgw._core", name = "Hold", subclass)]
pub struct Hold {
    #[pyo3(get, set)]
    has_rpm: bool,
    #[pyo3(get, set)]
    has_conc: bool,
    #[pyo3(get, set)]
    metered: bool,
    #[pyo3(get, set)]
    units: i64,
    #[pyo3(get, set)]
    units_until: f64,
    #[pyo3(get, set)]
    slots_free: i64,
    #[pyo3(get, set)]
    last_used: f64,
    #[pyo3(get, set)]
    tok: Option<Py<TokenLease>>,
}

#[pymethods]
impl Hold {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self {
            has_rpm: false,
            has_conc: false,
            metered: false,
            units: 0,
            units_until: 0.0,
            slots_free: 0,
            last_used: 0.0,
            tok: None,
        }
    }
}

impl Hold {
    /// Whether a request can take from this hold now, without a lease call.
    ///
    /// A token balance above 0 admits one more request even when its estimate is
    /// larger: the bound `llmgw.control.limits` states (one request per worker and scope).
    fn ready(&self, py: Python<'_>, now: f64) -> bool {
        if self.has_rpm && (self.units <= 0 || self.units_until <= now) {
            return false;
        }
        if self.has_conc && self.slots_free <= 0 {
            return false;
        }
        if self.metered {
            match &self.tok {
                None => return false,
                Some(t) => {
                    let t = t.borrow(py);
                    if t.balance <= 0 || t.until <= now {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// At most a key's and a project's: inline, so that admitting a request allocates only its ticket.
type Few<T> = SmallVec<[Py<T>; 2]>;

/// What one admitted request holds; `release` gives it back.
#[pyclass(module = "llmgw._core", name = "Ticket", frozen)]
pub struct Ticket {
    slotted: Few<Hold>,
    leases: Few<TokenLease>,
    cost: i64,
}

#[pymethods]
impl Ticket {
    #[new]
    #[pyo3(signature = (slotted = Vec::new(), leases = Vec::new(), cost = 0))]
    fn new(slotted: Vec<Py<Hold>>, leases: Vec<Py<TokenLease>>, cost: i64) -> Self {
        Self {
            slotted: slotted.into(),
            leases: leases.into(),
            cost,
        }
    }

    /// The request ended (whatever way): its slots come back, and the difference
    /// between its estimate and the `tokens` it used goes back to the leases it took from.
    fn release(&self, py: Python<'_>, tokens: i64) {
        for h in &self.slotted {
            h.borrow_mut(py).slots_free += 1;
        }
        let diff = self.cost - tokens;
        for t in &self.leases {
            let mut t = t.borrow_mut(py);
            t.balance += diff;
            t.in_flight -= 1;
        }
    }

    /// The holds whose slot this request took.
    #[getter]
    fn slotted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.slotted.iter().map(|h| h.clone_ref(py)))
    }

    /// The token leases this request took its estimate from.
    #[getter]
    fn leases<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.leases.iter().map(|t| t.clone_ref(py)))
    }

    /// The token estimate taken from each lease.
    #[getter]
    fn cost(&self) -> i64 {
        self.cost
    }
}

/// Admits a request from `holds` (a tuple of `Hold`) at `now`: takes a unit where an
/// rpm applies, a slot where a concurrency limit does and `cost` tokens where tokens
/// are metered, from every hold or from none. None when one of them lacks something
/// (a lease call is needed, or a refusal holds: the caller tells which).
#[pyfunction]
pub fn admit(holds: &Bound<'_, PyTuple>, now: f64, cost: i64) -> PyResult<Option<Ticket>> {
    let py = holds.py();
    let mut all: SmallVec<[Bound<'_, Hold>; 2]> = SmallVec::with_capacity(holds.len());
    for item in holds.iter() {
        let h = item.cast_into::<Hold>()?;
        if !h.borrow().ready(py, now) {
            return Ok(None);
        }
        all.push(h);
    }
    let mut slotted = Few::new();
    let mut leases = Few::new();
    for h in all {
        let mut hold = h.borrow_mut();
        hold.last_used = now;
        if hold.has_rpm {
            hold.units -= 1;
        }
        if hold.has_conc {
            hold.slots_free -= 1;
        }
        if hold.metered {
            if let Some(t) = &hold.tok {
                let mut tok = t.borrow_mut(py);
                tok.balance -= cost;
                tok.in_flight += 1;
                drop(tok);
                leases.push(t.clone_ref(py));
            }
        }
        let has_conc = hold.has_conc;
        drop(hold);
        if has_conc {
            slotted.push(h.unbind());
        }
    }
    Ok(Some(Ticket {
        slotted,
        leases,
        cost,
    }))
}

/// `Limiter.take`'s common case in one call: the shares `memo` holds for `entry`'s key
/// (`memo[entry.key_id] == (entry, project, shares)`, as `Limiter._shares` worked them out
/// for this very entry and project) admit the request (a `Ticket`) or need a lease call
/// (None). False when the memo holds nothing current for it, or no share limits it: the
/// caller works those out.
#[pyfunction]
pub fn take(
    memo: &Bound<'_, PyDict>,
    entry: &Bound<'_, PyAny>,
    project: &Bound<'_, PyAny>,
    now: f64,
    cost: i64,
) -> PyResult<Py<PyAny>> {
    let py = memo.py();
    let miss = || PyBool::new(py, false).to_owned().into_any().unbind();
    let Some(held) = memo.get_item(entry.getattr(intern!(py, "key_id"))?)? else {
        return Ok(miss());
    };
    let Ok(held) = held.cast_into::<PyTuple>() else {
        return Ok(miss());
    };
    if held.len() != 3 || !held.get_item(0)?.is(entry) || !held.get_item(1)?.is(project) {
        return Ok(miss());
    }
    let Ok(shares) = held.get_item(2)?.cast_into::<PyTuple>() else {
        return Ok(miss());
    };
    if shares.is_empty() {
        return Ok(miss());
    }
    Ok(match admit(&shares, now, cost)? {
        Some(ticket) => Py::new(py, ticket)?.into_any(),
        None => py.None(),
    })
}
