//! Prices and costs as [`Money`]: integer micro-units of the workspace's currency, never floats.
//!
//! A price is given per million tokens as a decimal string with at most 6 decimals
//! (`"0.400000"`, written as [`Money`] reads it), and held as micro-units per million tokens. The cost of a request is
//! `(input_tokens × input + output_tokens × output) / 1_000_000` micro-units, computed in
//! `i128` and rounded **up** once, on the sum, to the next whole micro-unit: a request is never
//! charged less than what it used, and never more than one micro-unit over.

use cella_types::Money;
use serde::Deserialize;

/// Reads an amount of the config (a decimal string, see [`Money`]) that must not be negative.
pub fn non_negative<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Money, D::Error> {
    let m = Money::deserialize(d)?;
    if m.is_negative() {
        return Err(serde::de::Error::custom(format!(
            "{m} is negative; a price or reserve is 0 or more"
        )));
    }
    Ok(m)
}

/// A model's price per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(deserialize_with = "non_negative")]
    pub input: Money,
    #[serde(deserialize_with = "non_negative")]
    pub output: Money,
}

impl Price {
    /// Whether the model costs nothing (its requests need no funds).
    pub fn is_free(&self) -> bool {
        self.input.is_zero() && self.output.is_zero()
    }

    /// The cost of a request, rounded up to the micro-unit (see the module docs). Saturates
    /// at [`Money::MAX`] for absurd token counts rather than wrapping; never negative.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> Money {
        let per_million = |tokens: u64, price: Money| {
            i128::from(tokens).saturating_mul(i128::from(price.micros().max(0)))
        };
        let total = per_million(input_tokens, self.input)
            .saturating_add(per_million(output_tokens, self.output));
        let micros = total.saturating_add(999_999) / 1_000_000;
        Money::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn prices_read_as_money_and_are_never_negative() {
        let p: Price = toml::from_str("input = \"0.4\"\noutput = \"1.600000\"").unwrap();
        assert_eq!(p.input, Money::from_micros(400_000));
        assert_eq!(p.output, Money::from_micros(1_600_000));
        assert!(!p.is_free());
        let free: Price = toml::from_str("input = \"0\"\noutput = \"0.000000\"").unwrap();
        assert!(free.is_free());
        for bad in [
            "input = \"-0.000001\"\noutput = \"1\"",
            "input = \"0.1234567\"\noutput = \"1\"",
            "input = \"1e3\"\noutput = \"1\"",
            "input = 1\noutput = \"1\"",
            "input = \"1\"",
        ] {
            assert!(toml::from_str::<Price>(bad).is_err(), "{bad}");
        }
        let e = toml::from_str::<Price>("input = \"-1\"\noutput = \"1\"").unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
    }

    #[test]
    fn cost_is_exact_and_rounded_up_once() {
        let p = Price {
            input: m("0.400000"),
            output: m("1.600000"),
        };
        // 1000 tokens at 0.4 per million are 400 micro-units, 500 at 1.6 are 800.
        assert_eq!(p.cost(1000, 500).micros(), 1200);
        // 1 input token at 0.4 per million: 0.4 micro-units, rounded up to 1.
        assert_eq!(p.cost(1, 0).micros(), 1);
        // 3 × 0.4 + 1 × 1.6 = 2.8 → 3.
        assert_eq!(p.cost(3, 1).micros(), 3);
        // 1 × 0.4 + 1 × 0.4 would be 1 + 1 rounded apart; on the sum it is 0.8 → 1.
        let q = Price {
            input: Money::from_micros(400_000),
            output: Money::from_micros(400_000),
        };
        assert_eq!(q.cost(1, 1).micros(), 1);
        assert_eq!(q.cost(0, 0).micros(), 0);
        // A price that is not a whole number of micro-units per token: 7 tokens at
        // 0.000003 per million = 21 / 1e6 micro → 1.
        let r = Price {
            input: Money::from_micros(3),
            output: Money::from_micros(0),
        };
        assert_eq!(r.cost(7, 0).micros(), 1);
        assert_eq!(r.cost(1_000_000, 0).micros(), 3);
        assert_eq!(r.cost(1_000_001, 0).micros(), 4);
        // Huge counts do not wrap.
        let big = Price {
            input: Money::from_micros(i64::MAX),
            output: Money::from_micros(i64::MAX),
        };
        assert_eq!(big.cost(u64::MAX, u64::MAX).micros(), i64::MAX);
    }
}
