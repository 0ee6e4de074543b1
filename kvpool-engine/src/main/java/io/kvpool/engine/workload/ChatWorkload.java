package io.kvpool.engine.workload;

import java.util.SplittableRandom;

/**
 * A multi-turn chat workload: {@code conversations} conversations of {@code turns} turns, all opening
 * with one of {@code systemPrompts} shared system prompts; each turn's prompt is the whole history
 * (system prompt, every earlier user message and model answer) plus a new user message, so
 * prompts grow turn by turn and almost all of each prompt was seen before. Text is deterministic
 * from the seed; answers are whatever the model generates.
 *
 * @param systemTokens  tokens in each system prompt
 * @param userTokens    tokens in each user message
 * @param answerTokens  max tokens of each answer
 * @param concurrency   conversations in flight at once (each runs its turns in order)
 */
public record ChatWorkload(int conversations, int turns, int systemPrompts, int systemTokens, int userTokens,
                           int answerTokens, int concurrency, long seed) {

    public ChatWorkload {
        if (conversations < 1 || turns < 1 || systemPrompts < 1 || concurrency < 1) {
            throw new IllegalArgumentException("conversations, turns, system prompts and concurrency must be >= 1");
        }
        if (systemTokens < 0 || userTokens < 1 || answerTokens < 1) {
            throw new IllegalArgumentException("system tokens must be >= 0, user and answer tokens >= 1");
        }
    }

    /** The longest prompt a turn can have. */
    public int maxPromptTokens() {
        return 1 + systemTokens + turns * userTokens + (turns - 1) * answerTokens;
    }

    private static final String[] WORDS = ("the of and to in is that for it as with was on be at by this from or have an "
            + "they which one you had not but what all were when we there can been has more if will would who so no "
            + "kv cache block token prefix model layer attention memory pool node master segment weight update").split(" ");

    /** Text of about {@code tokens} bytes (byte-level tokens), deterministic from (seed, a, b). */
    public String text(long a, long b, int tokens) {
        SplittableRandom r = new SplittableRandom(seed * 1_000_003L + a * 8191 + b);
        StringBuilder s = new StringBuilder(tokens + 16);
        while (s.length() < tokens) {
            s.append(WORDS[r.nextInt(WORDS.length)]).append(' ');
        }
        s.setLength(tokens);
        return s.toString();
    }

    public String systemPrompt(int conversation) {
        return text(-1, conversation % systemPrompts, systemTokens);
    }

    public String userMessage(int conversation, int turn) {
        return text(conversation, turn, userTokens);
    }
}
