-- The generation of a sandbox's preview tokens: part of what they are signed with, so raising it
-- (a rotation) invalidates every token handed out before.
ALTER TABLE sandboxes ADD COLUMN preview_token_gen INTEGER NOT NULL DEFAULT 0;
