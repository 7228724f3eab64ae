//! [`Money`]: an exact amount in a workspace's currency, as integer micro-units (millionths).
//!
//! On the wire an amount is a JSON string holding a plain decimal with at most 6 decimals:
//! an optional `-`, one or more digits, and optionally a point followed by one to six digits
//! (`"12.5"`, `"0.000001"`, `"-3"`). Anything else is refused with a message naming what is
//! wrong: exponents (`"1e3"`), a point without digits on either side (`"1."`, `".5"`), signs
//! other than one leading `-`, spaces, more than 6 decimals, or a value outside `i64`
//! micro-units. A JSON number is refused too (amounts are never floats). It is always written
//! with exactly 6 decimals (`"12.500000"`, `"-0.000001"`, `"0.000000"`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Micro-units in one unit of the currency.
pub const MICROS_PER_UNIT: i64 = 1_000_000;

/// An exact amount of money: a whole number of micro-units (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, utoipa::ToSchema)]
#[schema(value_type = String, example = "12.500000")]
pub struct Money(i64);

/// Why a text is not an amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoneyError {
    /// Empty, or not a plain decimal (an exponent, a `+`, a space, a letter ...).
    NotANumber(String),
    /// More than 6 digits after the point.
    TooManyDecimals,
    /// Beyond what the store holds (about ±9.2 × 10^12 units).
    OutOfRange,
}

impl fmt::Display for MoneyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoneyError::NotANumber(why) => write!(
                f,
                "not a decimal amount ({why}); write it like \"12.5\" or \"0.000001\""
            ),
            MoneyError::TooManyDecimals => {
                write!(f, "an amount has at most 6 decimals (micro-units)")
            }
            MoneyError::OutOfRange => write!(f, "the amount is out of range"),
        }
    }
}

impl std::error::Error for MoneyError {}

impl Money {
    pub const ZERO: Money = Money(0);
    pub const MAX: Money = Money(i64::MAX);

    pub const fn from_micros(micros: i64) -> Money {
        Money(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    /// Whole units (`Money::units(3)` is `"3.000000"`); None when out of range.
    pub fn units(units: i64) -> Option<Money> {
        units.checked_mul(MICROS_PER_UNIT).map(Money)
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn checked_add(self, other: Money) -> Option<Money> {
        self.0.checked_add(other.0).map(Money)
    }

    pub fn checked_sub(self, other: Money) -> Option<Money> {
        self.0.checked_sub(other.0).map(Money)
    }

    /// `self` × `n`, None on overflow (a per-second rate times seconds, say).
    pub fn checked_mul(self, n: i64) -> Option<Money> {
        self.0.checked_mul(n).map(Money)
    }

    /// `self` × `n`, held at the bounds on overflow.
    pub fn saturating_mul(self, n: i64) -> Money {
        Money(self.0.saturating_mul(n))
    }

    pub fn saturating_add(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }
}

impl FromStr for Money {
    type Err = MoneyError;

    fn from_str(s: &str) -> Result<Money, MoneyError> {
        let nan = |why: &str| MoneyError::NotANumber(why.to_string());
        let (negative, body) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if body.is_empty() {
            return Err(nan("no digits"));
        }
        let (whole, frac) = match body.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (body, None),
        };
        if whole.is_empty() {
            return Err(nan("a digit must come before the point"));
        }
        if !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(nan("only digits, one point and a leading minus sign"));
        }
        let frac = match frac {
            None => "",
            Some("") => return Err(nan("a digit must follow the point")),
            Some(f) if !f.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(nan("only digits, one point and a leading minus sign"))
            }
            Some(f) if f.len() > 6 => return Err(MoneyError::TooManyDecimals),
            Some(f) => f,
        };
        // Digits only from here; leading zeros are fine ("007.5").
        let whole = whole.trim_start_matches('0');
        if whole.len() > 19 {
            return Err(MoneyError::OutOfRange);
        }
        let units: i128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| MoneyError::OutOfRange)?
        };
        let mut micros_frac: i128 = 0;
        for (i, b) in frac.bytes().enumerate() {
            micros_frac += i128::from(b - b'0') * 10i128.pow(5 - i as u32);
        }
        let mut v = units * i128::from(MICROS_PER_UNIT) + micros_frac;
        if negative {
            v = -v;
        }
        i64::try_from(v)
            .map(Money)
            .map_err(|_| MoneyError::OutOfRange)
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abs = self.0.unsigned_abs();
        let sign = if self.0 < 0 { "-" } else { "" };
        let unit = MICROS_PER_UNIT as u64;
        write!(f, "{sign}{}.{:06}", abs / unit, abs % unit)
    }
}

impl Serialize for Money {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Money {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Money, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Money;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an amount as a decimal string with at most 6 decimals, like \"12.5\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Money, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Wallet, ledger and usage (the wire objects)
// ---------------------------------------------------------------------------------------------

/// `GET /api/v1/workspaces/{id}/wallet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Wallet {
    /// The sum of every ledger entry's amount.
    pub balance: Money,
    /// Held for running sandboxes (and task runs): not spent yet, not available either.
    pub reserved: Money,
    /// `balance - reserved`: what new sandboxes and runs may still take.
    pub available: Money,
    pub currency: String,
}

/// `POST /api/v1/workspaces/{id}/wallet/credits` (the operator only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreditRequest {
    /// More than 0, at most 1000000000000.
    pub amount: Money,
    /// Free text kept with the entry (an invoice number, a note): 1-200 characters.
    pub reference: String,
}

/// What a ledger entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LedgerKind {
    Credit,
    Compute,
    Model,
    Refund,
}

/// One entry of `GET /api/v1/workspaces/{id}/ledger`. Absent fields do not apply to its kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerEntry {
    pub id: String,
    pub at: String,
    pub kind: LedgerKind,
    /// Positive for credits and refunds, negative for charges.
    pub amount: Money,
    /// The balance right after this entry.
    pub balance_after: Money,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Model entries: the model, and the tokens the upstream reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Compute entries: the seconds billed (at least 60) and the rate per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_sec: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_rate: Option<Money>,
}

/// Usage figures of one day, or of the whole range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageFigures {
    /// Billed compute seconds of sandboxes (and runs) that settled then.
    pub compute_sec: i64,
    pub compute_cost: Money,
    pub model_requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub model_cost: Money,
}

impl UsageFigures {
    /// Adds `other` to these figures (for totals), saturating rather than wrapping.
    pub fn add(&mut self, other: &UsageFigures) {
        self.compute_sec = self.compute_sec.saturating_add(other.compute_sec);
        self.compute_cost = self.compute_cost.saturating_add(other.compute_cost);
        self.model_requests = self.model_requests.saturating_add(other.model_requests);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.model_cost = self.model_cost.saturating_add(other.model_cost);
    }
}

/// One UTC day of `GET /api/v1/workspaces/{id}/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageDay {
    /// `YYYY-MM-DD` (UTC).
    pub date: String,
    #[serde(flatten)]
    pub figures: UsageFigures,
}

/// `GET /api/v1/workspaces/{id}/usage`: the days with any usage in `[from, to)`, oldest first,
/// and their totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageReport {
    pub from: String,
    pub to: String,
    pub currency: String,
    pub days: Vec<UsageDay>,
    pub totals: UsageFigures,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Money, MoneyError> {
        s.parse()
    }

    #[test]
    fn plain_decimals_parse_exactly() {
        assert_eq!(p("0"), Ok(Money(0)));
        assert_eq!(p("-0"), Ok(Money(0)));
        assert_eq!(p("12.5"), Ok(Money(12_500_000)));
        assert_eq!(p("12.500000"), Ok(Money(12_500_000)));
        assert_eq!(p("0.000001"), Ok(Money(1)));
        assert_eq!(p("-0.000001"), Ok(Money(-1)));
        assert_eq!(p("007.25"), Ok(Money(7_250_000)));
        assert_eq!(p("3"), Ok(Money(3_000_000)));
        assert_eq!(p("-3.1"), Ok(Money(-3_100_000)));
        // 0.1 + 0.2 is exact here.
        assert_eq!(
            p("0.1").unwrap().checked_add(p("0.2").unwrap()),
            Some(p("0.3").unwrap())
        );
    }

    #[test]
    fn anything_but_a_plain_decimal_is_refused_with_the_reason() {
        for bad in [
            "", "-", "1.", ".5", "-.5", "1e3", "1E3", "+1", " 1", "1 ", "1,5", "1.2.3", "0x10",
            "NaN", "inf", "--1", "1-", "½", "١",
        ] {
            assert!(
                matches!(p(bad), Err(MoneyError::NotANumber(_))),
                "{bad:?}: {:?}",
                p(bad)
            );
        }
        assert_eq!(p("0.0000001"), Err(MoneyError::TooManyDecimals));
        assert_eq!(p("1.1234567"), Err(MoneyError::TooManyDecimals));
        assert!(p("1.1234567")
            .unwrap_err()
            .to_string()
            .contains("6 decimals"));
    }

    #[test]
    fn the_range_is_that_of_i64_micro_units() {
        assert_eq!(p("9223372036854.775807"), Ok(Money(i64::MAX)));
        assert_eq!(p("-9223372036854.775808"), Ok(Money(i64::MIN)));
        assert_eq!(p("9223372036854.775808"), Err(MoneyError::OutOfRange));
        assert_eq!(p("-9223372036854.775809"), Err(MoneyError::OutOfRange));
        assert_eq!(p("99999999999999999999999999"), Err(MoneyError::OutOfRange));
        assert_eq!(
            p(&"9".repeat(5000)),
            Err(MoneyError::OutOfRange),
            "a huge number is refused, not a panic"
        );
        // Leading zeros do not count against the range.
        assert_eq!(p(&format!("{}1", "0".repeat(100))), Ok(Money(1_000_000)));
    }

    #[test]
    fn it_is_written_with_exactly_six_decimals() {
        assert_eq!(Money(0).to_string(), "0.000000");
        assert_eq!(Money(12_500_000).to_string(), "12.500000");
        assert_eq!(Money(-1).to_string(), "-0.000001");
        assert_eq!(Money(-1_500_000).to_string(), "-1.500000");
        assert_eq!(Money(i64::MIN).to_string(), "-9223372036854.775808");
        assert_eq!(Money(i64::MAX).to_string(), "9223372036854.775807");
        for m in [
            0,
            1,
            -1,
            999_999,
            1_000_000,
            i64::MIN,
            i64::MAX,
            123_456_789,
        ] {
            assert_eq!(p(&Money(m).to_string()), Ok(Money(m)), "round trip of {m}");
        }
    }

    #[test]
    fn json_is_a_string_and_never_a_number() {
        assert_eq!(
            serde_json::to_string(&Money(2_000_001)).unwrap(),
            "\"2.000001\""
        );
        assert_eq!(
            serde_json::from_str::<Money>("\"2.5\"").unwrap(),
            Money(2_500_000)
        );
        for bad in [
            "2.5",
            "2",
            "null",
            "true",
            "[\"1\"]",
            "\"1e3\"",
            "\"1.0000001\"",
        ] {
            assert!(serde_json::from_str::<Money>(bad).is_err(), "{bad}");
        }
        let e = serde_json::from_str::<Money>("\"1.0000001\"").unwrap_err();
        assert!(e.to_string().contains("6 decimals"), "{e}");
    }
}
