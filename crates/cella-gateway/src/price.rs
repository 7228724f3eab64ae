//! Prices and costs in integer micro-units of the workspace's currency: never floats.
//!
//! A price is given per million tokens as a decimal string with at most 6 decimals
//! (`"0.400000"`), and held as micro-units per million tokens. The cost of a request is
//! `(input_tokens × input + output_tokens × output) / 1_000_000` micro-units, computed in
//! `i128` and rounded **up** once, on the sum, to the next whole micro-unit: a request is never
//! charged less than what it used, and never more than one micro-unit over.

use serde::Deserialize;

/// An amount in micro-units (1/1_000_000 of the currency), parsed from a decimal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Micros(pub i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("{0:?} is not a decimal number (write it like \"0.400000\")")]
    NotANumber(String),
    #[error("{0:?} has more than 6 decimals")]
    TooManyDecimals(String),
    #[error("{0:?} is out of range")]
    OutOfRange(String),
    #[error("{0:?} is negative")]
    Negative(String),
}

impl Micros {
    /// Parses a decimal string with at most 6 decimals (`"12"`, `"0.4"`, `"-1.250000"`).
    pub fn parse(s: &str) -> Result<Micros, AmountError> {
        let t = s.trim();
        let (neg, body) = match t.strip_prefix('-') {
            Some(b) => (true, b),
            None => (false, t.strip_prefix('+').unwrap_or(t)),
        };
        let (int, frac) = match body.split_once('.') {
            Some((i, f)) => (i, f),
            None => (body, ""),
        };
        let digits = |x: &str| x.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() && frac.is_empty()
            || !digits(int)
            || !digits(frac)
            || (body.contains('.') && frac.is_empty() && int.is_empty())
        {
            return Err(AmountError::NotANumber(s.to_string()));
        }
        if frac.len() > 6 {
            return Err(AmountError::TooManyDecimals(s.to_string()));
        }
        let range = || AmountError::OutOfRange(s.to_string());
        let int_v: i128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| range())?
        };
        let mut frac_v: i128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| range())?
        };
        for _ in frac.len()..6 {
            frac_v *= 10;
        }
        let v = int_v
            .checked_mul(1_000_000)
            .and_then(|x| x.checked_add(frac_v))
            .ok_or_else(range)?;
        let v = if neg { -v } else { v };
        i64::try_from(v).map(Micros).map_err(|_| range())
    }

    /// Parses a non-negative amount.
    pub fn parse_non_negative(s: &str) -> Result<Micros, AmountError> {
        let m = Micros::parse(s)?;
        if m.0 < 0 {
            return Err(AmountError::Negative(s.to_string()));
        }
        Ok(m)
    }
}

impl std::fmt::Display for Micros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0 as i128;
        let sign = if v < 0 { "-" } else { "" };
        let a = v.abs();
        write!(f, "{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
    }
}

impl<'de> Deserialize<'de> for Micros {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Micros::parse_non_negative(&s).map_err(serde::de::Error::custom)
    }
}

/// A model's price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: Micros,
    pub output: Micros,
}

impl Price {
    /// The cost of a request in micro-units, rounded up (see the module docs). Saturates at
    /// `i64::MAX` for absurd token counts rather than wrapping.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> i64 {
        let total: i128 = (input_tokens as i128)
            .saturating_mul(self.input.0 as i128)
            .saturating_add((output_tokens as i128).saturating_mul(self.output.0 as i128));
        let micros = total.saturating_add(999_999) / 1_000_000;
        i64::try_from(micros).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(Micros::parse("0.400000").unwrap(), Micros(400_000));
        assert_eq!(Micros::parse("1.6").unwrap(), Micros(1_600_000));
        assert_eq!(Micros::parse("12").unwrap(), Micros(12_000_000));
        assert_eq!(Micros::parse(".5").unwrap(), Micros(500_000));
        assert_eq!(Micros::parse("-0.000001").unwrap(), Micros(-1));
        assert_eq!(Micros(1_600_000).to_string(), "1.600000");
        assert_eq!(Micros(-1).to_string(), "-0.000001");
        assert!(matches!(
            Micros::parse("0.1234567"),
            Err(AmountError::TooManyDecimals(_))
        ));
        for bad in ["", ".", "abc", "1e3", "1.2.3", "0x10", " - 1"] {
            assert!(
                matches!(Micros::parse(bad), Err(AmountError::NotANumber(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            Micros::parse("99999999999999999999"),
            Err(AmountError::OutOfRange(_))
        ));
        assert!(matches!(
            Micros::parse_non_negative("-1"),
            Err(AmountError::Negative(_))
        ));
    }

    #[test]
    fn cost_is_exact_and_rounded_up_once() {
        let p = Price {
            input: Micros::parse("0.400000").unwrap(),
            output: Micros::parse("1.600000").unwrap(),
        };
        // 1000 tokens at 0.4 per million are 400 micro-units, 500 at 1.6 are 800.
        assert_eq!(p.cost(1000, 500), 1200);
        // 1 input token at 0.4 per million: 0.4 micro-units, rounded up to 1.
        assert_eq!(p.cost(1, 0), 1);
        // 3 × 0.4 + 1 × 1.6 = 2.8 → 3.
        assert_eq!(p.cost(3, 1), 3);
        // 1 × 0.4 + 1 × 0.4 would be 1 + 1 rounded apart; on the sum it is 0.8 → 1.
        let q = Price {
            input: Micros(400_000),
            output: Micros(400_000),
        };
        assert_eq!(q.cost(1, 1), 1);
        assert_eq!(q.cost(0, 0), 0);
        // A price that is not a whole number of micro-units per token: 7 tokens at
        // 0.000003 per million = 21 / 1e6 micro → 1.
        let r = Price {
            input: Micros(3),
            output: Micros(0),
        };
        assert_eq!(r.cost(7, 0), 1);
        assert_eq!(r.cost(1_000_000, 0), 3);
        assert_eq!(r.cost(1_000_001, 0), 4);
        // Huge counts do not wrap.
        let big = Price {
            input: Micros(i64::MAX),
            output: Micros(i64::MAX),
        };
        assert_eq!(big.cost(u64::MAX, u64::MAX), i64::MAX);
    }
}
