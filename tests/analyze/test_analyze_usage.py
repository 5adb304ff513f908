from prefixcache.analyze.usage import Usage, normalize_usage


def test_openai_chat_completions():
    u = normalize_usage({"prompt_tokens": 2006, "completion_tokens": 300,
                         "prompt_tokens_details": {"cached_tokens": 1920}})
    assert u == Usage("openai", 2006, 1920, 0, 300)


def test_openai_without_details_and_responses_api():
    assert normalize_usage({"prompt_tokens": 10, "completion_tokens": 2,
                            "prompt_tokens_details": None}) == Usage("openai", 10, 0, 0, 2)
    assert normalize_usage({"input_tokens": 5000, "output_tokens": 7,
                            "input_tokens_details": {"cached_tokens": 4096}}) == \
        Usage("openai", 5000, 4096, 0, 7)


def test_anthropic_prompt_is_the_sum():
    u = normalize_usage({"input_tokens": 21, "cache_creation_input_tokens": 188086,
                         "cache_read_input_tokens": 1000, "output_tokens": 393})
    assert u == Usage("anthropic", 21 + 188086 + 1000, 1000, 188086, 393)


def test_deepseek_hit_and_miss():
    u = normalize_usage({"prompt_tokens": 1995, "completion_tokens": 93,
                         "prompt_tokens_details": {"cached_tokens": 320},
                         "prompt_cache_hit_tokens": 320, "prompt_cache_miss_tokens": 1675})
    assert u == Usage("deepseek", 1995, 320, 0, 93)


def test_gemini_usage_metadata():
    assert normalize_usage({"promptTokenCount": 3000, "cachedContentTokenCount": 2048,
                            "candidatesTokenCount": 50}) == Usage("gemini", 3000, 2048, 0, 50)


def test_unknown_is_none():
    assert normalize_usage({"tokens": 3}) is None
    assert normalize_usage(None) is None
